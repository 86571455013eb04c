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
from service.engine import CUDA, Engine, OrtEngine, available_cores, name_this_thread
from service.generation.engine import EngineHooks
from service.generation.engine_thread import GenerationCore
from service.generation.grammar import Grammars
from service.generation.runner import DecoderRunner, StepResult
from service.generation.scheduler import Scheduler, SchedulerConfig, StepPlan
from service.generation.tuning import SPLIT_PAYS_S, decode_step_s, fastest_threads
from service.ipc import Executions, Placement
from service.latency_target import planner_for
from service.manifest import GenerationLayout, Manifest
from service.metrics import Metrics
from service.repository import ModelVersion, OfVersion
from service.settings import Settings
from service.stats import ModelStats
from service.tokenization import EncodedText, pad_batch

log = logging.getLogger(__name__)

# The real / padded token share a batch keeps unless configured. On a CPU a padded token costs what a real
# one does and a bigger batch gains nothing, so the floor is high: MiniLM-shaped at 64 clients, 3 alternating
# rounds, 0.85 -> 284 / 291 / 292 req/s (mean batch 15), 0.95 -> 301 / 309 / 308 (mean batch 8.6); the
# demo student 883 / 934 / 937 vs 862 / 939 / 951. On a GPU a bigger batch is nearly free: unchanged there.
CPU_PADDING_FLOOR = 0.95
GPU_PADDING_FLOOR = 0.85


def padding_floor(settings: Settings, provider: str) -> float:
    if settings.min_padding_efficiency is not None:
        return settings.min_padding_efficiency
    return GPU_PADDING_FLOOR if provider == CUDA else CPU_PADDING_FLOOR


class StartupError(RuntimeError):
    """The service cannot serve anything useful; start-up stops with this message."""


EngineFactory = Callable[[ModelVersion, str, Settings], Engine]


@dataclass(frozen=True)
class EnginePlan:
    """How many engine calls a model runs at once (all on its one session) and on how many threads each."""

    instances: int
    threads: int

    def settings(self, settings: Settings) -> Settings:
        """The settings an engine factory gets: the resolved thread count in place of `0 = auto`."""
        return settings.model_copy(update={"intra_op_threads": self.threads})


def engine_plan(
    settings: Settings, *, on_gpu: bool, generation: bool, cores: int | None = None
) -> EnginePlan:
    """On a CPU, one single-threaded call per core beats one call spread over every core: a parallel op waits
    for its slowest thread, and beside the event loop one of them is always late. ONNX Runtime alone, 2
    cores, batch 8, sequences/s: MiniLM-shaped 1 call x 2 threads 296-343 vs 2 calls x 1 thread 362-409;
    the demo student 1,457-1,670 vs 1,947-2,041. The price: a lone batch-1 call runs on one thread (MiniLM-
    shaped 6.2 vs 4.5 ms). A GPU runs one call at a time anyway; a decode loop is one call at a time (on a CPU
    on all cores or on one, as measured at start-up: `_faster_decoder`)."""
    cores = cores or available_cores()  # the engine core owns the device's cores
    if generation:
        instances = 1
    elif settings.instances:
        instances = settings.instances
    else:
        instances = 1 if on_gpu else cores
    return EnginePlan(instances, settings.intra_op_threads or max(1, cores // instances))


def choose_variant(manifest: Manifest, requested: str, on_gpu: bool) -> str:
    """The variant to serve: as requested, else fp16 on GPU, and on CPU int8 or else int4 (when exported),
    else fp32 (a variant that drafts only, `VariantSpec.drafts_only`, is not one settings can name). int4
    exists only for a model that was 4-bit at its source and computes what fp32 does: on a CPU it decodes
    one stream faster and holds a third of the memory, but decodes many streams together slower (SmolLM2,
    served: 1.38x tokens/s at 1 stream, 0.89x at 16; docs/benchmarks.md), where fp32 is the one to name."""
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
        engine, plan = _faster_decoder(version, variant, settings, engine_factory, engine, plan)
    executor = ThreadPoolExecutor(
        max_workers=plan.instances,
        thread_name_prefix=f"engine-{manifest.name}",
        initializer=name_this_thread,
        initargs=("ds-engine",),
    )
    name = manifest.name
    model = EngineModel(version, variant, engine, executor, plan)
    model.draft_engine = _draft_engine(version, settings, engine_factory, engine, plan)
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


def _draft_engine(
    version: ModelVersion, settings: Settings, engine_factory: EngineFactory, engine: Engine, plan: EnginePlan
) -> Engine | None:
    """The session of a student's draft variant (export.variants.build_draft), on the threads its served
    variant runs on, where speculative decoding may use it: on a CPU (on a GPU the fp16 it serves drafts),
    unless settings say off or to draft with the served variant, or it does not load."""
    manifest = version.manifest
    drafting = manifest.teacher is not None and settings.speculative != "off"
    if not drafting or settings.speculative_draft == "served" or engine.provider == CUDA:
        return None
    variant = next((name for name, spec in manifest.variants.items() if spec.drafts_only), None)
    if variant is None:
        return None
    try:
        return engine_factory(version, variant, plan.settings(settings))
    except Exception as e:  # a draft that cannot load never keeps its model from serving
        log.warning(
            "%s v%d: its %s variant did not load (%s); the variant it serves drafts instead",
            manifest.name,
            manifest.version,
            variant,
            str(e).splitlines()[0][:200],
        )
        return None


def _faster_decoder(
    version: ModelVersion,
    variant: str,
    settings: Settings,
    engine_factory: EngineFactory,
    engine: Engine,
    plan: EnginePlan,
) -> tuple[Engine, EnginePlan]:
    """On a CPU, the decoder's session on all cores or on one, whichever runs a busy decode step faster
    (service.generation.tuning); the other is dropped. A model too short to time, or a timing that fails,
    keeps all cores: this only ever chooses, it never stops a start-up."""
    manifest = version.manifest
    assert manifest.generation is not None
    positions = manifest.max_sequence_length
    prompt = min(32, positions // 2)
    steps = min(8, positions - prompt - 2)  # every step's position inside the model's
    if prompt < 1 or steps < 2:
        return engine, plan
    one = EnginePlan(instances=1, threads=1)
    rows = min(16, settings.gen_max_batch)
    layout = manifest.generation
    try:
        all_cores_s = decode_step_s(engine, layout, rows, prompt, steps)
        if all_cores_s >= SPLIT_PAYS_S:  # no second session built and timed: seconds of every start-up
            log.info(
                "%s v%d: a decode step of %d sequences takes %.2f ms on %d thread(s): long enough to split",
                manifest.name,
                manifest.version,
                rows,
                all_cores_s * 1000,
                plan.threads,
            )
            return engine, plan
        candidates = [(plan.threads, engine), (1, engine_factory(version, variant, one.settings(settings)))]
        timed = fastest_threads(candidates, lambda e: decode_step_s(e, layout, rows, prompt, steps))
    except Exception as e:  # a failing timing leaves the default in place
        log.warning(
            "%s v%d: timing the decoder's threads failed (%s); all cores", manifest.name, manifest.version, e
        )
        return engine, plan
    log.info(
        "%s v%d: a decode step of %d sequences takes %s; serving on %d thread(s)",
        manifest.name,
        manifest.version,
        rows,
        ", ".join(f"{t.step_s * 1000:.2f} ms on {t.threads} thread(s)" for t in timed),
        timed[0].threads,
    )
    chosen = dict(candidates)[timed[0].threads]
    return chosen, plan if timed[0].threads == plan.threads else one
