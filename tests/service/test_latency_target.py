"""Batching driven by a latency target: the cost fit, the planner's caps, a simulated burst on two engine
threads, and the real batcher obeying the planner (and batching as before without one)."""

from __future__ import annotations

import asyncio
import heapq
import random
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
from fastapi.testclient import TestClient
from prometheus_client import CollectorRegistry

from service.app import create_app
from service.batch_policy import BatchCaps, BatchPolicy, BatchStats, select_batch
from service.batching import MicroBatcher
from service.latency_target import (
    MIN_BATCHES,
    RUN_SHARE,
    CostModel,
    LatencyTarget,
    fit_cost,
    planner_for,
    slack_of,
)
from service.metrics import Metrics
from service.settings import Settings

FIXED_S, PER_TOKEN_S = 0.010, 0.002  # the fake engine: 10 ms a call + 2 ms a padded token
TARGET_S = 0.400


def stats(padded: int, run_s: float, size: int = 1) -> BatchStats:
    return BatchStats(size, padded, padded, [0.0] * size, run_s, failed=False)


def fitted(
    target_s: float = TARGET_S, fixed_s: float = FIXED_S, per_token_s: float = PER_TOKEN_S
) -> LatencyTarget:
    """A planner that has seen batches of several shapes from an exact cost law."""
    planner = LatencyTarget(target_s)
    for padded in (10, 20, 40, 80, 10, 30, 60, 120, 50, 90):
        planner.observe(stats(padded, fixed_s + per_token_s * padded))
    return planner


# -- the cost model ------------------------------------------------------------------------------------------


def test_the_fit_recovers_a_known_cost_law() -> None:
    tokens = [16, 32, 64, 128, 256, 512, 48, 96]
    line = fit_cost(tokens, [0.003 + 0.00005 * x for x in tokens])
    assert line.fixed_s == pytest.approx(0.003)
    assert line.per_token_s == pytest.approx(0.00005)

    rng = random.Random(0)  # with 5 % noise, still close
    tokens = [rng.randrange(10, 600) for _ in range(200)]
    line = fit_cost(tokens, [(0.003 + 0.00005 * x) * rng.uniform(0.95, 1.05) for x in tokens])
    assert line.fixed_s == pytest.approx(0.003, rel=0.2)
    assert line.per_token_s == pytest.approx(0.00005, rel=0.05)


def test_each_fit_is_reported_with_the_tokens_a_fresh_batch_may_carry() -> None:
    metrics = Metrics(CollectorRegistry())
    planner = LatencyTarget(TARGET_S, on_fit=metrics.planner_fitted("m"))
    for padded in (10, 20, 40, 80, 10, 30, 60, 120):  # MIN_BATCHES of an exact cost law: the first fit
        planner.observe(stats(padded, FIXED_S + PER_TOKEN_S * padded))
    sample = metrics.registry.get_sample_value
    planned = sample("distilserve_planned_batch_tokens", {"model": "m"})
    assert planned == int((RUN_SHARE * TARGET_S - FIXED_S) / PER_TOKEN_S)  # 95: a run of half the target
    assert planner.caps(BatchPolicy(max_batch_size=64, max_batch_tokens=4096), 0.0, 1).max_tokens == planned
    assert sample("distilserve_engine_cost_seconds", {"model": "m", "term": "fixed"}) == pytest.approx(
        FIXED_S
    )
    assert sample("distilserve_engine_cost_seconds", {"model": "m", "term": "per_token"}) == pytest.approx(
        PER_TOKEN_S
    )


def test_one_shape_or_a_negative_intercept_fits_through_the_origin() -> None:
    # One batch shape: no slope to see; proportional over-predicts bigger batches rather than under.
    assert fit_cost([10, 10, 10], [0.02, 0.02, 0.02]) == CostModel(0.0, pytest.approx(0.002))
    line = fit_cost([10, 100], [0.001, 0.1])  # the line would cross zero at 9 tokens
    assert line.fixed_s == 0.0 and line.per_token_s > 0


def test_slack_budgets_for_runs_slower_than_predicted() -> None:
    line = CostModel(0.0, 0.001)
    tokens = [10] * 10
    runs = [0.010] * 8 + [0.015, 0.020]
    assert slack_of(line, tokens, runs, quantile=0.9) == pytest.approx(1.5)
    assert slack_of(line, tokens, [0.005] * 10) == 1.0  # never below the fit
    assert line.run_s(10) == pytest.approx(0.010)
    assert CostModel(0.002, 0.001, slack=2.0).tokens_within(0.024) == 10


def test_the_planner_fits_from_the_batches_it_observes_and_skips_failed_ones() -> None:
    planner = LatencyTarget(TARGET_S)
    for i in range(MIN_BATCHES - 1):
        planner.observe(stats(10 * (i + 1), FIXED_S + PER_TOKEN_S * 10 * (i + 1)))
    assert planner.model is None
    planner.observe(BatchStats(1, 500, 500, [0.0], 99.0, failed=True))
    assert planner.model is None
    planner.observe(stats(200, FIXED_S + PER_TOKEN_S * 200))
    assert planner.model is not None
    assert planner.model.fixed_s == pytest.approx(FIXED_S)
    assert planner.model.per_token_s == pytest.approx(PER_TOKEN_S)
    assert planner.model.slack == pytest.approx(1.0)


# -- the caps it picks ---------------------------------------------------------------------------------------


POLICY = BatchPolicy(max_batch_size=64, max_batch_tokens=4096, max_wait_s=0.5)


def test_before_it_has_measured_anything_the_fixed_ceilings_apply_without_a_wait() -> None:
    assert LatencyTarget(TARGET_S).caps(POLICY, 0.0, 10) == BatchCaps(64, 4096, 0.0)


def test_a_fresh_queue_gets_the_largest_batch_that_runs_within_half_the_target() -> None:
    planner = fitted()
    caps = planner.caps(POLICY, 0.0, 10)
    assert caps.max_tokens == 95  # (0.200 - 0.010) / 0.002
    assert caps.max_size == 9  # of 10-token items
    assert planner.model is not None
    assert planner.model.run_s(caps.max_tokens) <= RUN_SHARE * TARGET_S
    assert planner.model.run_s(caps.max_tokens + 10) > RUN_SHARE * TARGET_S
    assert 0 < caps.max_wait_s <= FIXED_S + 1e-9  # a fuller batch saves at most one call's fixed cost


def test_an_older_oldest_item_gets_a_batch_that_finishes_in_its_time() -> None:
    planner = fitted()
    caps = planner.caps(POLICY, 0.300, 10)  # 100 ms left: 45 tokens' worth
    assert caps.max_tokens == 45 and caps.max_size == 4
    assert caps.max_wait_s == 0.0  # nothing to spare for a wait
    assert planner.caps(POLICY, 0.380, 5).max_size == 1  # just the oldest: 20 ms


def test_a_queue_behind_the_target_catches_up_with_the_largest_batches() -> None:
    planner = fitted()
    assert planner.caps(POLICY, 0.395, 10) == BatchCaps(64, 4096, 0.0)  # its 30 ms run is late anyway


def test_the_policys_caps_stay_ceilings() -> None:
    planner = fitted(target_s=10.0)
    caps = planner.caps(BatchPolicy(max_batch_size=8, max_batch_tokens=512), 0.0, 10)
    assert (caps.max_size, caps.max_tokens, caps.max_wait_s) == (8, 512, pytest.approx(FIXED_S))


def test_a_served_model_shows_its_planners_choice_in_the_metrics(tiny_repository: Path) -> None:
    settings = Settings(model_repository=tiny_repository, latency_target_ms=500, warmup=False)
    with TestClient(create_app(settings)) as client:
        for n in range(MIN_BATCHES + 1):  # one at a time: each its own batch, of a few shapes
            response = client.post("/v1/classify", json={"model": "tiny-cls", "inputs": ["word " * (n + 1)]})
            assert response.status_code == 200
        exposition = client.get("/metrics").text
    planned = [
        line for line in exposition.splitlines() if line.startswith("distilserve_planned_batch_tokens{")
    ]
    assert planned and 'model="tiny-cls"' in planned[0] and float(planned[0].split()[-1]) > 0
    assert 'distilserve_engine_cost_seconds{model="tiny-cls",term="per_token"}' in exposition


def test_without_a_target_the_service_builds_no_planner() -> None:
    assert planner_for(Settings().latency_target_ms) is None
    planner = planner_for(Settings(latency_target_ms=250).latency_target_ms)
    assert isinstance(planner, LatencyTarget) and planner.target_s == 0.25


# -- a simulated burst ---------------------------------------------------------------------------------------


def simulate(
    arrivals: list[tuple[float, int]], policy: BatchPolicy, planner: LatencyTarget | None, threads: int = 2
) -> list[float]:
    """Each item's queue + run on `threads` engine threads (the batcher's rules, no wait, on a clock of our
    own) with the fake engine's cost law; the planner, when given, learns from each batch as it runs."""
    queue: list[tuple[float, int]] = []  # (arrived, cost), FIFO
    pending = sorted(arrivals)
    free = [(0.0, i) for i in range(threads)]  # (when, thread)
    latencies: list[float] = []
    clock = 0.0
    while pending or queue:
        free_at, thread = heapq.heappop(free)
        now = max(free_at, clock)  # a thread freed earlier sat idle until the last event
        if not queue:
            now = max(now, pending[0][0])  # an idle thread runs the next arrival at once
        clock = now
        while pending and pending[0][0] <= now:
            queue.append(pending.pop(0))
        if planner is None:
            caps = BatchCaps(policy.max_batch_size, policy.max_batch_tokens, 0.0)
        else:
            caps = planner.caps(policy, now - queue[0][0], queue[0][1])
        chosen = select_batch([c for _, c in queue], caps.max_size, caps.max_tokens)
        batch = [queue[i] for i in chosen]
        queue = [q for i, q in enumerate(queue) if i not in set(chosen)]
        padded = len(batch) * max(c for _, c in batch)
        run = FIXED_S + PER_TOKEN_S * padded
        latencies += [now + run - arrived for arrived, _ in batch]
        if planner is not None:
            planner.observe(stats(padded, run, len(batch)))
        heapq.heappush(free, (now + run, thread))
    return latencies


def test_in_a_burst_the_planners_batches_hold_the_target_where_a_fixed_large_cap_misses_it() -> None:
    rng = random.Random(1)
    quiet = [(0.1 * i, rng.randrange(5, 30)) for i in range(20)]  # one at a time: the planner learns
    burst = [(3.0, 10)] * 24  # then 24 at once, 240 ms of work on either thread alone
    policy = BatchPolicy(max_batch_size=32, max_batch_tokens=8192)

    fixed = simulate(quiet + burst, policy, None)
    planned = simulate(quiet + burst, policy, LatencyTarget(TARGET_S))
    assert max(fixed) > TARGET_S + 0.05  # one thread takes the whole burst; the other idles
    assert max(planned) < TARGET_S
    assert max(fixed[:20]) == max(planned[:20])  # light load: the same (nobody waits)


# -- the real batcher ----------------------------------------------------------------------------------------


class CostlyEngine:
    """Sleeps as long as the cost law says for each batch (strings: a token per character)."""

    def __init__(self) -> None:
        self.batches: list[list[str]] = []
        self.release = threading.Event()
        self.release.set()

    def __call__(self, items: list[str]) -> list[str]:
        self.release.wait(5)
        self.batches.append(list(items))
        time.sleep(FIXED_S + PER_TOKEN_S * len(items) * max(map(len, items)))
        return [x.upper() for x in items]


class Recording:
    """A planner wrapper that remembers every cap it gave."""

    def __init__(self, inner: LatencyTarget | None) -> None:
        self.inner = inner
        self.given: list[BatchCaps] = []

    def caps(self, policy: BatchPolicy, oldest_age_s: float, oldest_cost: int) -> BatchCaps:
        caps = (
            BatchCaps(policy.max_batch_size, policy.max_batch_tokens, policy.max_wait_s)
            if self.inner is None
            else self.inner.caps(policy, oldest_age_s, oldest_cost)
        )
        self.given.append(caps)
        return caps

    def observe(self, batch: BatchStats) -> None:
        if self.inner is not None:
            self.inner.observe(batch)


def serve_burst(
    engine: CostlyEngine,
    policy: BatchPolicy,
    planner: Recording | None,
    items: list[str],
    concurrency: int = 2,
    hold: bool = False,
) -> list[BatchStats]:
    """Submit `items` at once (behind a held first batch when `hold`); the stats of every batch."""
    seen: list[BatchStats] = []

    async def main() -> None:
        with ThreadPoolExecutor(max_workers=concurrency) as executor:
            batcher: MicroBatcher[str, str] = MicroBatcher(
                engine,
                policy,
                cost=len,
                executor=executor,
                concurrency=concurrency,
                on_batch=seen.append,
                planner=planner,
            )
            batcher.start()
            try:
                first = []
                if hold:
                    engine.release.clear()
                    first = [asyncio.ensure_future(batcher.submit("held"))]
                    await asyncio.sleep(0.05)
                rest = [asyncio.ensure_future(batcher.submit(x)) for x in items]
                await asyncio.sleep(0.01)
                engine.release.set()
                assert await asyncio.gather(*first, *rest) == [x.upper() for x in ["held"] * hold + items]
            finally:
                engine.release.set()
                await batcher.close()

    asyncio.run(main())
    return seen


def test_the_batcher_takes_the_planners_caps_and_holds_the_target_in_a_burst() -> None:
    policy = BatchPolicy(max_batch_size=32, max_batch_tokens=8192)
    items = [f"{i:010d}" for i in range(24)]  # 10 tokens each: 490 ms in one batch

    planner = Recording(fitted())
    planned = serve_burst(CostlyEngine(), policy, planner, items)
    assert planner.given and all(c.max_tokens <= 95 or c.max_size == 32 for c in planner.given)
    assert max(s.size for s in planned) <= 9
    for s in planned:  # recorded queue + run per item: ~320 ms at most, planned; generous margin
        assert max(s.queue_wait_s) + s.run_s < TARGET_S

    fixed = serve_burst(CostlyEngine(), policy, None, items)
    assert max(s.size for s in fixed) > 9  # the fixed cap lets one thread take most of the burst


def test_without_a_planner_or_with_one_giving_the_policys_caps_batches_are_the_fixed_policys() -> None:
    policy = BatchPolicy(max_batch_size=4, max_batch_tokens=40)
    items = ["x" * n for n in (3, 9, 4, 8, 5, 12, 6, 7, 3, 10)]
    expected: list[list[str]] = [["held"]]
    queue = list(items)
    while queue:  # held behind the first batch, the queue is cut by the policy's caps alone
        chosen = select_batch([len(x) for x in queue], policy.max_batch_size, policy.max_batch_tokens)
        expected.append([queue[i] for i in chosen])
        queue = [x for i, x in enumerate(queue) if i not in chosen]

    for planner in (None, Recording(None)):
        engine = CostlyEngine()
        serve_burst(engine, policy, planner, items, concurrency=1, hold=True)
        assert engine.batches == expected
