"""Every Prometheus metric of the service, defined once (prefix `distilserve_`, base units)."""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.multiprocess import MultiProcessCollector

from service.batch_policy import BatchStats
from service.generation.engine import EngineHooks
from service.generation.runner import StepResult
from service.generation.scheduler import StepPlan
from service.latency_target import CostModel

if TYPE_CHECKING:
    from service.tracing import Tracing

LATENCY_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0)
BATCH_BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128, 256)
TOKEN_BUCKETS = (16, 64, 256, 1024, 4096, 16384, 65536)
IPC_BUCKETS = (25e-6, 50e-6, 100e-6, 250e-6, 500e-6, 0.001, 0.0025, 0.005, 0.01, 0.05)
RATIO_BUCKETS = (0.0, 0.05, 0.1, 0.2, 0.3, 0.5, 0.7, 0.9, 1.0)


@dataclass(frozen=True)
class ModelSeries:
    """One model's series of the per-request and per-batch metrics, resolved once.

    `labels()` takes a lock and builds a key on every call (~5 us); the hot path runs a dozen per request.
    """

    tokenize_duration: Histogram
    queue_duration: Histogram
    inference_duration: Histogram
    batch_size: Histogram
    batch_tokens: Histogram
    padding_ratio: Histogram
    batch_real_tokens: Counter
    batch_padded_tokens: Counter
    batch_failures: Counter
    queue_depth: Gauge

    def observe_batch(self, stats: BatchStats) -> None:
        self.batch_size.observe(stats.size)
        self.batch_tokens.observe(stats.padded_tokens)
        self.padding_ratio.observe(1.0 - stats.real_tokens / stats.padded_tokens)
        self.batch_real_tokens.inc(stats.real_tokens)
        self.batch_padded_tokens.inc(stats.padded_tokens)
        self.inference_duration.observe(stats.run_s)
        for wait in stats.queue_wait_s:
            self.queue_duration.observe(wait)
        if stats.failed:
            self.batch_failures.inc()


def multiprocess_dir() -> str | None:
    """Where worker processes keep their metric files (prometheus_client's multiprocess mode), if they do.

    prometheus_client picks file-backed values at import when this variable is set, so the supervisor sets
    it before it starts the workers (service.workers).
    """
    return os.environ.get("PROMETHEUS_MULTIPROC_DIR") or None


def clear_multiprocess_dir() -> None:
    """Empty the multiprocess directory, if one is set: the files of an earlier run would add up."""
    directory = multiprocess_dir()
    if directory is not None:
        Path(directory).mkdir(parents=True, exist_ok=True)
        for stale in Path(directory).glob("*.db"):
            stale.unlink()


class Metrics:
    """One instance per app, on its own registry, so several apps (tests) never collide.

    Under `python -m service` the engine core and every frontend write their own series to files, and a
    scrape of any frontend sums them (`exposition`): counters and histograms add up, gauges are the live
    processes' sum (`livesum`). Engine series (batches, queues, generation steps) come from the core,
    request series from the frontends.

    `tracing`: the process's OpenTelemetry tracing (service.tracing; None when off), the other half of what
    it reports: handed down with the series, so the engine's batchers find it where they find their own.
    """

    def __init__(self, registry: CollectorRegistry | None = None, tracing: Tracing | None = None) -> None:
        self.registry = registry or CollectorRegistry()
        self.tracing = tracing
        r = self.registry
        self.requests = Counter(
            "distilserve_requests",
            "HTTP requests by model, task and status code.",
            ["model", "task", "status"],
            registry=r,
        )
        self.request_duration = Histogram(
            "distilserve_request_duration_seconds",
            "End-to-end request latency.",
            ["model", "task"],
            buckets=LATENCY_BUCKETS,
            registry=r,
        )
        self.queue_duration = Histogram(
            "distilserve_queue_duration_seconds",
            "Time a sequence waited in the batch queue.",
            ["model"],
            buckets=LATENCY_BUCKETS,
            registry=r,
        )
        self.ipc_duration = Histogram(
            "distilserve_ipc_duration_seconds",
            "A request's round trip between a frontend and the engine core, less the time the core held it "
            "(queue and engine): the cost of the hop itself.",
            ["model"],
            buckets=IPC_BUCKETS,
            registry=r,
        )
        self.tokenize_duration = Histogram(
            "distilserve_tokenize_duration_seconds",
            "Tokenization time per request.",
            ["model"],
            buckets=LATENCY_BUCKETS,
            registry=r,
        )
        self.inference_duration = Histogram(
            "distilserve_inference_duration_seconds",
            "Engine time per batch (padding and run).",
            ["model"],
            buckets=LATENCY_BUCKETS,
            registry=r,
        )
        self.batch_size = Histogram(
            "distilserve_batch_size",
            "Sequences per engine call.",
            ["model"],
            buckets=BATCH_BUCKETS,
            registry=r,
        )
        self.batch_tokens = Histogram(
            "distilserve_batch_tokens",
            "Padded tokens per engine call.",
            ["model"],
            buckets=TOKEN_BUCKETS,
            registry=r,
        )
        self.padding_ratio = Histogram(
            "distilserve_batch_padding_ratio",
            "Share of an engine call's tokens that are padding.",
            ["model"],
            buckets=RATIO_BUCKETS,
            registry=r,
        )
        self.batch_real_tokens = Counter(
            "distilserve_batch_real_tokens",
            "Real (unpadded) tokens sent to the engine.",
            ["model"],
            registry=r,
        )
        self.batch_padded_tokens = Counter(
            "distilserve_batch_padded_tokens",
            "Tokens the engine computed, padding included.",
            ["model"],
            registry=r,
        )
        self.batch_failures = Counter(
            "distilserve_batch_failures",
            "Engine calls that failed.",
            ["model"],
            registry=r,
        )
        self.queue_depth = Gauge(
            "distilserve_queue_depth",
            "Sequences waiting for the engine.",
            ["model"],
            multiprocess_mode="livesum",
            registry=r,
        )
        self.planned_batch_tokens = Gauge(
            "distilserve_planned_batch_tokens",
            "Latency target: padded tokens the planner lets a batch carry when nothing is late.",
            ["model"],
            multiprocess_mode="livemax",
            registry=r,
        )
        self.engine_cost_seconds = Gauge(
            "distilserve_engine_cost_seconds",
            "Latency target: the planner's fitted engine cost of a batch, slack included: "
            "term=fixed per call, term=per_token per padded token.",
            ["model", "term"],
            multiprocess_mode="livemax",
            registry=r,
        )
        self.in_flight = Gauge(
            "distilserve_requests_in_flight",
            "HTTP requests being handled.",
            multiprocess_mode="livesum",
            registry=r,
        )
        self.engine_core_memory = Gauge(
            "distilserve_engine_core_resident_memory_bytes",
            "The engine core's resident set (weights, KV caches, ONNX Runtime's arenas), read each second "
            "(python -m service only: in-process serving has no core of its own).",
            multiprocess_mode="livemax",
            registry=r,
        )
        self.startup_seconds = Gauge(
            "distilserve_startup_seconds",
            "Where a process's start-up went (service.startup): imports, repository, sessions, warm-up.",
            ["role", "phase"],
            multiprocess_mode="livemax",
            registry=r,
        )
        self.model_loads = Counter(
            "distilserve_model_loads",
            "Model versions loaded by model control (service.model_control), at start-up and while serving: "
            "outcome ready (it took the traffic) or failed (validation, session or warm-up; never served).",
            ["model", "outcome"],
            registry=r,
        )
        self.model_info = Gauge(
            "distilserve_model_info",
            "Served models (1; 0 once unloaded by model control): name, version, task, variant, provider.",
            ["model", "version", "task", "variant", "provider"],
            multiprocess_mode="livemax",
            registry=r,
        )

        self.generated_tokens = Counter(
            "distilserve_generated_tokens", "Tokens generated.", ["model"], registry=r
        )
        # prefix cache hit rate = prefix cache tokens / prompt tokens
        self.prompt_tokens = Counter(
            "distilserve_prompt_tokens", "Prompt tokens prefilled (cached or run).", ["model"], registry=r
        )
        self.prefix_cache_tokens = Counter(
            "distilserve_prefix_cache_tokens",
            "Prompt tokens whose keys and values came from the prefix cache instead of a prefill.",
            ["model"],
            registry=r,
        )
        # speculative decoding: acceptance = accepted / drafted; tokens a teacher step = 1 + accepted / checks
        self.draft_tokens = Counter(
            "distilserve_draft_tokens",
            "Tokens a teacher's draft (its student) proposed.",
            ["model"],
            registry=r,
        )
        self.draft_tokens_accepted = Counter(
            "distilserve_draft_tokens_accepted",
            "Draft tokens the teacher kept (speculative decoding).",
            ["model"],
            registry=r,
        )
        self.speculative_checks = Counter(
            "distilserve_speculative_checks",
            "Sequence steps the teacher verified drafts in (each emits 1 + its accepted drafts).",
            ["model"],
            registry=r,
        )
        # the cascade (service.cascade): fallback rate = fallbacks / inputs; teacher load = fallbacks
        self.cascade_inputs = Counter(
            "distilserve_cascade_inputs",
            "Inputs a student with a served teacher answered first (cascade on).",
            ["model"],
            registry=r,
        )
        self.cascade_fallbacks = Counter(
            "distilserve_cascade_fallbacks",
            "Inputs below the cascade's threshold, answered by the student's teacher instead.",
            ["model", "teacher"],
            registry=r,
        )
        self.cascade_kept = Counter(
            "distilserve_cascade_kept",
            "Inputs below the cascade's threshold whose student answer stood because the teacher could not "
            "take them (reason: overloaded, its queue full; unavailable, its engine away; late, past the "
            "cascade's budget or the request's deadline); for a pair whose teacher answers directly, inputs "
            "the student answered instead.",
            ["model", "teacher", "reason"],
            registry=r,
        )
        # live agreement (shadow checks): agreement = agreed / compared, beside the export-time figure
        self.shadow_compared = Counter(
            "distilserve_shadow_compared",
            "Student answers the teacher checked off the client's path (DISTILSERVE_SHADOW_RATE).",
            ["model", "teacher"],
            registry=r,
        )
        self.shadow_agreed = Counter(
            "distilserve_shadow_agreed",
            "Checked student answers whose best answer equals the teacher's (an embedding student: the sum "
            "of its vectors' cosines with the teacher's).",
            ["model", "teacher"],
            registry=r,
        )
        self.shadow_dropped = Counter(
            "distilserve_shadow_dropped",
            "Sampled student answers left unchecked: the teacher was busy with client work, or too late.",
            ["model", "teacher"],
            registry=r,
        )
        self.cascade_threshold = Gauge(
            "distilserve_cascade_threshold",
            "A paired student's default cascade threshold now (DISTILSERVE_CASCADE_CALIBRATION=live: as "
            "recalibrated on what it serves; else its export's).",
            ["model"],
            registry=r,
            multiprocess_mode="livemax",  # frontends calibrate apart: the highest, the one sending most
        )
        # traffic capture (service.capture): what a pair's teacher answered, kept as training data
        self.capture_records = Counter(
            "distilserve_capture_records",
            "Inputs a student's teacher answered, queued to DISTILSERVE_CAPTURE_DIR (source: cascade, "
            "shadow, teacher).",
            ["model", "source"],
            registry=r,
        )
        self.capture_dropped = Counter(
            "distilserve_capture_dropped",
            "Captured inputs not written (reason: queue, the writer behind; full, the file at "
            "DISTILSERVE_CAPTURE_MAX_MB; error, the disk).",
            ["model", "reason"],
            registry=r,
        )
        # retrieve-then-read QA (service.tasks.retrieval): hit rate = hits / (hits + misses)
        self.passage_cache_hits = Counter(
            "distilserve_passage_cache_hits",
            "Passages whose embedding came from the passage cache (or repeated one of the same request).",
            ["model"],
            registry=r,
        )
        self.passage_cache_misses = Counter(
            "distilserve_passage_cache_misses",
            "Passages the embedding model had to embed for retrieve-then-read QA.",
            ["model"],
            registry=r,
        )
        self.distillation_agreement = Gauge(
            "distilserve_distillation_agreement",
            "The student's agreement with its teacher on the eval split, as its distillation report says (an "
            "embedding student: its vectors' mean cosine with the teacher's).",
            ["model", "teacher"],
            multiprocess_mode="livemax",
            registry=r,
        )
        self.time_to_first_token = Histogram(
            "distilserve_time_to_first_token_seconds",
            "From arrival to the first generated token.",
            ["model"],
            buckets=LATENCY_BUCKETS,
            registry=r,
        )
        self.inter_token_latency = Histogram(
            "distilserve_inter_token_latency_seconds",
            "Between two tokens of one sequence.",
            ["model"],
            buckets=LATENCY_BUCKETS,
            registry=r,
        )
        self.generation_step_duration = Histogram(
            "distilserve_generation_step_duration_seconds",
            "Engine time per step, by phase.",
            ["model", "phase"],
            buckets=LATENCY_BUCKETS,
            registry=r,
        )
        self.prefix_cache_bytes = Gauge(
            "distilserve_prefix_cache_bytes",
            "Bytes of keys and values the model's prefix caches hold (its draft's included), of "
            "DISTILSERVE_GEN_PREFIX_CACHE_MB each.",
            ["model"],
            multiprocess_mode="livesum",
            registry=r,
        )
        self.running_sequences = Gauge(
            "distilserve_running_sequences",
            "Sequences in the running generation batch.",
            ["model"],
            multiprocess_mode="livesum",
            registry=r,
        )
        self.waiting_sequences = Gauge(
            "distilserve_waiting_sequences",
            "Generation requests waiting to join.",
            ["model"],
            multiprocess_mode="livesum",
            registry=r,
        )
        self._models: dict[str, ModelSeries] = {}
        self._requests: dict[tuple[str, str, int], tuple[Counter, Histogram]] = {}

    def exposition(self) -> bytes:
        """The text a scrape gets: this app's registry, or every worker's files summed."""
        directory = multiprocess_dir()
        if directory is None:
            return generate_latest(self.registry)
        merged = CollectorRegistry()
        MultiProcessCollector(merged, path=directory)
        return generate_latest(merged)

    def generation_hooks(self, model: str) -> EngineHooks:
        """The generation engine's reports, turned into this model's metrics (series exist from the start).

        They run on the engine thread, between decode steps: the series are looked up once, and the queue
        gauges are written only when they change (each write of a multiprocess value takes a lock)."""
        tokens = self.generated_tokens.labels(model)
        prefill_s = self.generation_step_duration.labels(model, "prefill")
        decode_s = self.generation_step_duration.labels(model, "decode")
        running_now, waiting_now = self.running_sequences.labels(model), self.waiting_sequences.labels(model)
        running_now.set(0)
        waiting_now.set(0)
        last = [0, 0]

        drafted, accepted = self.draft_tokens.labels(model), self.draft_tokens_accepted.labels(model)
        checks = self.speculative_checks.labels(model)
        prompt, cached = self.prompt_tokens.labels(model), self.prefix_cache_tokens.labels(model)
        held = self.prefix_cache_bytes.labels(model)
        held.set(0)
        last_held = [0]

        def on_step(plan: StepPlan, result: StepResult) -> None:
            tokens.inc(len(result.tokens) + sum(len(more) for more in result.more.values()))
            if result.prompt_tokens:
                prompt.inc(result.prompt_tokens)
                cached.inc(result.cached_tokens)
            if result.prefix_cache_bytes != last_held[0]:  # written only when it changes, as the gauges below
                held.set(result.prefix_cache_bytes)
                last_held[0] = result.prefix_cache_bytes
            if result.checked:  # speculative decoding: tokens per teacher step = 1 + accepted / checks
                drafted.inc(result.drafted)
                accepted.inc(result.accepted)
                checks.inc(result.checked)
            if plan.prefill:
                prefill_s.observe(result.prefill_s)
            if plan.decode:
                decode_s.observe(result.decode_s)

        def on_queue(running: int, waiting: int) -> None:
            if running != last[0]:
                running_now.set(running)
                last[0] = running
            if waiting != last[1]:
                waiting_now.set(waiting)
                last[1] = waiting

        return EngineHooks(
            on_step=on_step,
            on_first_token=self.time_to_first_token.labels(model).observe,
            on_token=self.inter_token_latency.labels(model).observe,
            on_queue=on_queue,
        )

    def for_model(self, model: str) -> ModelSeries:
        """`model`'s series (created at first use, so they exist from start-up with zero counts)."""
        series = self._models.get(model)
        if series is None:
            series = self._models[model] = ModelSeries(
                tokenize_duration=self.tokenize_duration.labels(model),
                queue_duration=self.queue_duration.labels(model),
                inference_duration=self.inference_duration.labels(model),
                batch_size=self.batch_size.labels(model),
                batch_tokens=self.batch_tokens.labels(model),
                padding_ratio=self.padding_ratio.labels(model),
                batch_real_tokens=self.batch_real_tokens.labels(model),
                batch_padded_tokens=self.batch_padded_tokens.labels(model),
                batch_failures=self.batch_failures.labels(model),
                queue_depth=self.queue_depth.labels(model),
            )
        return series

    def planner_fitted(self, model: str) -> Callable[[CostModel, int], None]:
        """Where `model`'s latency-target planner reports each new fit (service.latency_target)."""
        tokens = self.planned_batch_tokens.labels(model)
        fixed, per_token = (self.engine_cost_seconds.labels(model, term) for term in ("fixed", "per_token"))

        def fitted(cost: CostModel, planned_tokens: int) -> None:
            tokens.set(planned_tokens)
            fixed.set(cost.slack * cost.fixed_s)
            per_token.set(cost.slack * cost.per_token_s)

        return fitted

    def request_series(self, model: str, task: str, status: int) -> tuple[Counter, Histogram]:
        """The request counter and latency series of one (model, task, status), resolved once."""
        key = (model, task, status)
        series = self._requests.get(key)
        if series is None:
            series = self._requests[key] = (
                self.requests.labels(model, task, str(status)),
                self.request_duration.labels(model, task),
            )
        return series
