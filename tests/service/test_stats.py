"""The per-model statistics counters, and how the runtime feeds them from batches and generation steps."""

from __future__ import annotations

from service.batch_policy import BatchStats
from service.exchange import Exchange
from service.generation.engine import EngineHooks
from service.generation.runner import StepResult
from service.generation.sampling import SamplingParams
from service.generation.scheduler import StepPlan
from service.generation.sequence import Sequence
from service.runtime import counting_batches, counting_steps
from service.stats import Duration, ModelStats


def test_a_success_adds_its_items_and_times_a_failure_only_its_time() -> None:
    stats = ModelStats()
    context = Exchange(tokenize_s=0.001, queue_s=0.002, inference_s=0.003, items=3)
    stats.observe_request(True, 0.01, context)
    stats.observe_request(True, 0.02, Exchange())  # generation: no queue or engine time of its own
    stats.observe_request(False, 0.005, context)
    assert (stats.success, stats.fail) == (Duration(2, 30_000_000), Duration(1, 5_000_000))
    assert stats.inference_count == 3 + 1
    assert (stats.queue_ns, stats.compute_input_ns, stats.compute_infer_ns) == (
        2_000_000,
        1_000_000,
        3_000_000,
    )


def test_engine_calls_count_by_batch_size() -> None:
    stats = ModelStats()
    for size, seconds in ((4, 0.002), (1, 0.001), (4, 0.003)):
        stats.observe_execution(size, seconds)
    assert stats.execution_count == 3 and stats.last_inference_ms > 0
    assert stats.batches == {4: Duration(2, 5_000_000), 1: Duration(1, 1_000_000)}


def test_the_batchers_report_reaches_metrics_and_statistics_failed_calls_only_metrics() -> None:
    stats, seen = ModelStats(), []
    on_batch = counting_batches(seen.append, stats)
    ok = BatchStats(
        size=2, real_tokens=8, padded_tokens=8, queue_wait_s=[0.0, 0.0], run_s=0.004, failed=False
    )
    on_batch(ok)
    on_batch(
        BatchStats(size=3, real_tokens=9, padded_tokens=9, queue_wait_s=[0.0] * 3, run_s=0.1, failed=True)
    )
    assert len(seen) == 2
    assert stats.execution_count == 1 and stats.batches == {2: Duration(1, 4_000_000)}


def test_a_generation_step_is_a_prefill_call_and_a_decode_call() -> None:
    stats, steps = ModelStats(), []
    hooks = counting_steps(EngineHooks(on_step=lambda plan, result: steps.append(plan)), stats)
    assert hooks.on_step is not None

    def seqs(n: int) -> list[Sequence]:
        return [Sequence(prompt=[1, 2], params=SamplingParams(max_new_tokens=2)) for _ in range(n)]

    hooks.on_step(StepPlan(prefill=seqs(1), decode=seqs(3)), StepResult({}, prefill_s=0.001, decode_s=0.002))
    hooks.on_step(StepPlan(prefill=[], decode=seqs(3)), StepResult({}, prefill_s=0.0, decode_s=0.002))
    assert len(steps) == 2 and stats.execution_count == 3
    assert stats.batches == {1: Duration(1, 1_000_000), 3: Duration(2, 4_000_000)}
