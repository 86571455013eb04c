"""The engine side of a model version: its session, its batcher or generation core, wired at start-up.

This is what the engine core process holds (service.core); frontends hold `service.served.ServedModel`."""

from __future__ import annotations

import logging
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field, replace

import numpy as np

from service import graph_cache
from service.batch_policy import BatchPolicy, BatchStats
from service.batching import ClientWork, MicroBatcher
from service.decoder_sessions import draft_engine, faster_decoder, int4_or_fp32
from service.engine import CUDA, Engine, OrtEngine, name_this_thread
from service.engine_plan import EngineFactory, EnginePlan, engine_plan, padding_floor
from service.generation.engine import EngineHooks
from service.generation.engine_thread import GenerationCore
from service.generation.grammar import Grammars
from service.generation.runner import DecoderRunner, StepResult
from service.generation.scheduler import Scheduler, SchedulerConfig, StepPlan
from service.ipc import Executions, Placement
from service.latency_target import planner_for
from service.manifest import GenerationLayout, Manifest
from service.metrics import Metrics
from service.repository import ModelVersion, OfVersion
from service.settings import Settings
from service.stats import ModelStats
from service.tokenization import EncodedText, pad_batch

log = logging.getLogger(__name__)


class StartupError(RuntimeError):
    """The service cannot serve anything useful; start-up stops with this message."""


def choose_variant(manifest: Manifest, requested: str, on_gpu: bool) -> str:
    """The variant to serve: as requested, else fp16 on GPU, and on CPU int8, else int4 (a model 4-bit at
    its source: fp32's answers; a decoder's fp32 graph is then served beside it, service.decoder_sessions),
    else fp32 (a variant that drafts only, `VariantSpec.drafts_only`, is not one settings can name)."""
    if requested != "auto":
        if requested not in manifest.variants:
            raise ValueError(f"{manifest.name} v{manifest.version} has no {requested!r} variant")
        return requested
    preferred = ["fp16", "fp32"] if on_gpu else ["int8", "int4", "fp32"]
    return next(v for v in preferred if v in manifest.variants)


def ort_engine_factory(version: ModelVersion, variant: str, settings: Settings) -> Engine:
    spec = version.manifest.variants[variant]
    # Weights beside the graph (past 2 GB) are not cached: ONNX Runtime writes an optimised graph as one file
    # (which they do not fit in) that still points at the exported weights' file by a relative name.
    cached = settings.graph_cache_dir is not None and spec.data is None
    return OrtEngine(
        version.file(spec.file),
        device=settings.device,
        require_gpu=settings.require_gpu,
        intra_op_threads=settings.intra_op_threads,
        inter_op_threads=settings.inter_op_threads,
        io_binding=settings.io_binding,
        spinning="off" if settings.thread_spinning == "off" else "run",  # auto: decided per repository
        cached_graph=graph_cache.cached_graph(settings.graph_cache_dir, spec.sha256)
        if cached and settings.graph_cache_dir is not None
        else None,
    )


BatchFinish = Callable[[dict[str, np.ndarray]], dict[str, np.ndarray]]


@dataclass(frozen=True)
class EngineAsks:
    """Work a task's outputs need that is cheapest on the engine, once per batch (each task says its own:
    service.tasks, `ServedTask.engine`).

    `gather_token`: only the positions holding this token (of the manifest) come back, not a row per
    token; `finish`: post-processing of a whole batch's outputs, run on the engine thread."""

    gather_token: Callable[[Manifest], int | None] | None = None
    finish: BatchFinish | None = None


class EncoderRunner:
    """Runs a batch of encoded sequences through an encoder graph; returns each item's own outputs.

    Outputs with a sequence axis come back cut to the item's real length (padding never leaks out), or, with
    `gather_token_id` (fill-mask), only at the positions holding that token: a vocabulary-wide row per token
    of a long text would be copied for nothing.
    """

    def __init__(
        self,
        engine: Engine,
        pad_token_id: int,
        per_position: frozenset[str] = frozenset(),
        gather_token_id: int | None = None,
        finish: BatchFinish | None = None,
    ) -> None:
        self.engine = engine
        self.pad_token_id = pad_token_id
        self.per_position = per_position
        self.gather_token_id = gather_token_id
        self.finish = finish  # the task's batch-wide post-processing, here on the engine thread
        self._wanted = set(engine.input_names)

    def __call__(self, rows: list[EncodedText]) -> list[dict[str, np.ndarray]]:
        feeds = {k: v for k, v in pad_batch(rows, self.pad_token_id).items() if k in self._wanted}
        outputs = self.engine.run(feeds)
        if self.finish is not None:
            outputs = self.finish(outputs)
        return [self._own(i, row, outputs) for i, row in enumerate(rows)]

    def _own(self, i: int, row: EncodedText, outputs: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        keep: np.ndarray | slice = slice(0, len(row))
        if self.gather_token_id is not None:
            keep = np.flatnonzero(row.input_ids == self.gather_token_id)
        return {
            name: (array[i][keep] if name in self.per_position else array[i]).copy()
            for name, array in outputs.items()
        }


def per_position_outputs(manifest: Manifest) -> frozenset[str]:
    """Outputs whose second axis is the (symbolic) sequence axis."""
    return frozenset(o.name for o in manifest.outputs if len(o.shape) >= 2 and isinstance(o.shape[1], str))


@dataclass
class EngineModel(OfVersion):
    """One model version as the engine core runs it: its session, and its batcher or generation core."""

    version: ModelVersion
    variant: str
    engine: Engine
    executor: ThreadPoolExecutor
    plan: EnginePlan
    runner: EncoderRunner | None = None  # encoder tasks: requests batch through the micro-batcher
    batcher: MicroBatcher[EncodedText, dict[str, np.ndarray]] | None = None
    generation: GenerationCore | None = None  # text generation: the continuous-batching engine thread
    draft_engine: Engine | None = None  # a generation student's draft variant, run to draft for its teacher
    stats: ModelStats = field(default_factory=ModelStats)  # Triton's statistics: the engine calls

    def placement(self) -> Placement:
        max_queue = self.batcher.policy.max_queue if self.batcher is not None else 0
        return Placement(
            self.name,
            self.manifest.version,
            self.variant,
            self.engine.provider,
            self.plan.instances,
            self.plan.threads,
            max_queue,
        )

    def executions(self) -> Executions:
        s = self.stats
        batches = [
            (size, d.count, d.ns) for size, d in sorted(dict(s.batches).items())
        ]  # one copy: see stats
        return Executions(self.name, self.manifest.version, s.execution_count, s.last_inference_ms, batches)

    def start(self) -> None:
        """Start the batcher or the generation loop (inside the running event loop)."""
        if self.batcher is not None:
            self.batcher.start()
        if self.generation is not None:
            self.generation.start()

    async def close(self) -> None:
        """Finish queued and running work, then stop."""
        if self.batcher is not None:
            await self.batcher.close()
        if self.generation is not None:
            await self.generation.close()
        self.executor.shutdown(wait=True)

    def warm_up(self) -> None:
        """Run the engine over the shapes batches will take, so no real request pays a first-call cost."""
        if self.generation is not None:
            self.generation.warm_up()
            return
        assert self.runner is not None and self.batcher is not None
        policy = self.batcher.policy
        pad = self.manifest.tokenizer.pad_token_id
        for length in sorted({8, 32, self.manifest.max_sequence_length}):
            for size in sorted({1, min(8, policy.max_batch_size), policy.max_batch_size}):
                if size > 1 and size * length > policy.max_batch_tokens:
                    continue
                row = EncodedText(
                    input_ids=np.full(length, pad, dtype=np.int64),
                    type_ids=np.zeros(length, dtype=np.int64),
                    offsets=[],
                    truncated=False,
                )
                self.runner([row] * size)


def _generation_core(
    layout: GenerationLayout,
    engine: Engine,
    executor: ThreadPoolExecutor,
    settings: Settings,
    hooks: EngineHooks,
    grammars: Grammars,
) -> GenerationCore:
    """Its deliver and fail are bound by whoever streams its tokens (service.served, service.core)."""
    config = SchedulerConfig(
        max_running=settings.gen_max_batch,
        prefill_tokens=settings.gen_prefill_tokens,
        max_cached_tokens=settings.gen_max_cached_tokens,
        max_waiting=settings.gen_max_waiting,
    )
    runner = DecoderRunner(
        engine,
        layout,
        prefill_tokens=settings.gen_prefill_tokens,
        prefix_cache_bytes=settings.gen_prefix_cache_mb << 20,
    )
    return GenerationCore(
        runner,
        Scheduler(config, cached=runner.cached_length),
        layout.stop_ids(),
        executor,
        on_step=hooks.on_step,
        on_queue=hooks.on_queue,
        grammars=grammars,
    )


def counting_batches(
    observe: Callable[[BatchStats], None], stats: ModelStats
) -> Callable[[BatchStats], None]:
    """The micro-batcher's report of each engine call, to the metrics and to the model's statistics."""

    def on_batch(batch: BatchStats) -> None:
        observe(batch)
        if not batch.failed:
            stats.observe_execution(batch.size, batch.run_s)

    return on_batch


def counting_steps(hooks: EngineHooks, stats: ModelStats) -> EngineHooks:
    """The generation engine's hooks, with each step's prefill and decode calls also counted as the
    model's executions (on the engine thread, as the step hook runs)."""
    observe = hooks.on_step

    def on_step(plan: StepPlan, result: StepResult) -> None:
        if observe is not None:
            observe(plan, result)
        if plan.prefill:
            stats.observe_execution(len(plan.prefill), result.prefill_s)
        if plan.decode:
            stats.observe_execution(len(plan.decode), result.decode_s)

    return replace(hooks, on_step=on_step)


def load_engine_model(
    version: ModelVersion,
    settings: Settings,
    metrics: Metrics,
    engine_factory: EngineFactory,
    clients: ClientWork | None = None,
    asks: EngineAsks = EngineAsks(),
) -> EngineModel:
    """Build what the engine runs for one model version; the batcher is started later, inside the loop.
    `clients`: the engine's batchers together, whose client work shadow items yield to; `asks`: what the
    model's task wants of each batch on the engine thread."""
    manifest = version.manifest
    generation = manifest.generation is not None
    plan = engine_plan(settings, on_gpu=False, generation=generation)
    variant = choose_variant(manifest, settings.variant, on_gpu=False)
    engine = engine_factory(version, variant, plan.settings(settings))
    if engine.provider == CUDA:  # only known once a session exists: ONNX Runtime may fall back to CPU
        gpu_plan = engine_plan(settings, on_gpu=True, generation=generation)
        gpu_variant = choose_variant(manifest, "auto", on_gpu=True) if settings.variant == "auto" else variant
        if (gpu_variant, gpu_plan.threads) != (variant, plan.threads):
            engine = engine_factory(version, gpu_variant, gpu_plan.settings(settings))
        variant, plan = gpu_variant, gpu_plan
    elif generation and settings.warmup and not settings.intra_op_threads and plan.threads > 1:
        engine, plan = faster_decoder(version, variant, settings, engine_factory, engine, plan)
    if generation and engine.provider != CUDA and (variant, settings.variant) == ("int4", "auto"):
        engine, variant = int4_or_fp32(version, settings, engine_factory, engine, plan)
    executor = ThreadPoolExecutor(
        max_workers=plan.instances,
        thread_name_prefix=f"engine-{manifest.name}",
        initializer=name_this_thread,
        initargs=("ds-engine",),
    )
    name = manifest.name
    model = EngineModel(version, variant, engine, executor, plan)
    model.draft_engine = draft_engine(version, settings, engine_factory, engine, plan)
    if manifest.generation is not None:
        hooks = counting_steps(metrics.generation_hooks(name), model.stats)
        grammars = Grammars(version.file(manifest.tokenizer.file), manifest.generation.stop_ids())
        model.generation = _generation_core(manifest.generation, engine, executor, settings, hooks, grammars)
    else:
        gather = asks.gather_token(manifest) if asks.gather_token is not None else None
        model.runner = EncoderRunner(
            engine, manifest.tokenizer.pad_token_id, per_position_outputs(manifest), gather, asks.finish
        )
        policy = BatchPolicy(
            max_batch_size=settings.max_batch_size,
            max_batch_tokens=settings.max_batch_tokens,
            max_wait_s=settings.max_wait_ms / 1000.0,
            max_queue=settings.max_queue,
            min_padding_efficiency=padding_floor(settings, engine.provider),
        )
        model.batcher = MicroBatcher(
            model.runner,
            policy,
            cost=len,
            executor=executor,
            concurrency=plan.instances,
            on_batch=counting_batches(metrics.for_model(name).observe_batch, model.stats),
            on_queue_depth=metrics.for_model(name).queue_depth.set,
            clients=clients,
            planner=planner_for(settings.latency_target_ms, metrics.planner_fitted(name)),  # one per model
            # tracing on: a span per engine call that carried a sampled request's row (service.tracing)
            trace_batch=metrics.tracing.batch_tracer(name, manifest.version) if metrics.tracing else None,
        )
    metrics.model_info.labels(name, str(manifest.version), manifest.task, variant, engine.provider).set(1)
    log.info(
        "serving %s v%d (%s) variant=%s provider=%s instances=%d threads=%d",
        name,
        manifest.version,
        manifest.task,
        variant,
        engine.provider,
        plan.instances,
        plan.threads,
    )
    return model
