"""The micro-batcher under concurrency, with a fake engine: coalescing, caps, grouping, failures, limits."""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Callable, Coroutine
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pytest

from service.batch_policy import (
    BatcherClosedError,
    BatchPolicy,
    BatchStats,
    DeadlineExceededError,
    QueueFullError,
    select_batch,
)
from service.batching import ClientWork, MicroBatcher


class FakeEngine:
    """Records every batch; doubles each item; optionally slow, optionally failing on a poisoned item."""

    def __init__(self, delay_s: float = 0.0, poison: str | None = None) -> None:
        self.batches: list[list[str]] = []
        self.delay_s = delay_s
        self.poison = poison
        self.release = threading.Event()
        self.release.set()

    def __call__(self, items: list[str]) -> list[str]:
        self.release.wait(5)
        self.batches.append(list(items))
        time.sleep(self.delay_s)
        if self.poison is not None and self.poison in items:
            raise RuntimeError("engine exploded")
        return [item * 2 for item in items]


def run(
    engine: FakeEngine,
    policy: BatchPolicy,
    body: Callable[[MicroBatcher[str, str]], Coroutine[Any, Any, Any]],
    stats: list[BatchStats] | None = None,
    concurrency: int = 1,
) -> Any:
    async def main() -> Any:
        with ThreadPoolExecutor(max_workers=concurrency) as executor:
            batcher: MicroBatcher[str, str] = MicroBatcher(
                engine,
                policy,
                cost=len,
                executor=executor,
                concurrency=concurrency,
                on_batch=stats.append if stats is not None else None,
            )
            batcher.start()
            try:
                return await body(batcher)
            finally:
                engine.release.set()
                await batcher.close()

    return asyncio.run(main())


def test_concurrent_requests_coalesce_and_each_caller_gets_its_own_result() -> None:
    engine = FakeEngine(delay_s=0.01)
    stats: list[BatchStats] = []
    items = [f"r{i}" for i in range(64)]

    async def body(b: MicroBatcher[str, str]) -> list[str]:
        return list(await asyncio.gather(*(b.submit(x) for x in items)))

    results = run(engine, BatchPolicy(max_batch_size=32), body, stats)
    assert results == [x * 2 for x in items]
    assert len(engine.batches) < 64
    assert sorted(x for batch in engine.batches for x in batch) == sorted(items)
    assert max(len(batch) for batch in engine.batches) <= 32
    assert sum(s.size for s in stats) == 64


def test_first_request_of_a_quiet_period_runs_alone_and_at_once() -> None:
    engine = FakeEngine()

    async def body(b: MicroBatcher[str, str]) -> float:
        started = time.perf_counter()
        assert await b.submit("solo") == "solosolo"
        return time.perf_counter() - started

    # max_wait is large, yet an idle engine must not wait for company.
    elapsed = run(engine, BatchPolicy(max_wait_s=2.0), body)
    assert engine.batches == [["solo"]]
    assert elapsed < 1.0


def test_batches_respect_the_padded_token_budget() -> None:
    engine = FakeEngine()
    engine.release.clear()  # hold the engine so the queue fills up
    stats: list[BatchStats] = []
    items = ["x" * n for n in (3, 50, 4, 48, 5, 52, 6, 47)]

    async def body(b: MicroBatcher[str, str]) -> list[str]:
        first = asyncio.ensure_future(b.submit("y"))
        await asyncio.sleep(0.05)
        rest = [asyncio.ensure_future(b.submit(x)) for x in items]
        await asyncio.sleep(0.05)
        engine.release.set()
        return [await first, *[await r for r in rest]]

    results = run(engine, BatchPolicy(max_batch_size=8, max_batch_tokens=110), body, stats)
    assert results == ["yy", *[x * 2 for x in items]]
    for s in stats:
        assert s.padded_tokens <= 110 or s.size == 1
    # Grouped by length: the short ones ride together, the long ones together.
    grouped = [sorted(len(x) for x in batch) for batch in engine.batches[1:]]
    assert [3, 4, 5, 6] in grouped
    assert all(max(g) - min(g) <= 5 for g in grouped)


def test_select_batch_keeps_the_oldest_and_groups_similar_lengths() -> None:
    costs = [10, 100, 11, 99, 12, 9]
    chosen = select_batch(costs, max_size=4, max_tokens=10_000)
    assert 0 in chosen
    assert sorted(costs[i] for i in chosen) == [9, 10, 11, 12]
    # An oversized oldest item still runs (alone), so nothing starves.
    assert select_batch([500, 1, 1], max_size=8, max_tokens=100) == [0]
    assert select_batch([], max_size=8, max_tokens=100) == []


def test_select_batch_keeps_padding_within_the_efficiency_floor() -> None:
    costs = [10, 30, 11, 9, 12, 28]
    chosen = select_batch(costs, max_size=8, max_tokens=10_000, min_efficiency=0.8)
    assert sorted(costs[i] for i in chosen) == [9, 10, 11, 12]  # 30 and 28 would pad the short ones 3x
    picked = [costs[i] for i in chosen]
    assert sum(picked) / (len(picked) * max(picked)) >= 0.8
    # The long ones then form their own efficient batch.
    rest = [30, 28]
    assert select_batch(rest, max_size=8, max_tokens=10_000, min_efficiency=0.8) == [0, 1]


def test_the_policys_efficiency_floor_shapes_the_batchers_batches() -> None:
    engine = FakeEngine()
    engine.release.clear()  # hold the engine so a mixed-length queue builds up behind the first item
    stats: list[BatchStats] = []
    items = ["x" * n for n in (10, 30, 11, 28, 9, 29)]

    async def body(b: MicroBatcher[str, str]) -> list[str]:
        first = asyncio.ensure_future(b.submit("y" * 10))
        await asyncio.sleep(0.05)
        rest = [asyncio.ensure_future(b.submit(x)) for x in items]
        await asyncio.sleep(0.05)
        engine.release.set()
        return [await first, *[await r for r in rest]]

    results = run(engine, BatchPolicy(max_batch_size=8, min_padding_efficiency=0.8), body, stats)
    assert results == ["y" * 20, *[x * 2 for x in items]]
    assert sorted(sorted(len(x) for x in batch) for batch in engine.batches[1:]) == [
        [9, 10, 11],
        [28, 29, 30],
    ]
    assert all(s.real_tokens >= 0.8 * s.padded_tokens for s in stats)


def test_a_failing_batch_fails_only_its_own_requests() -> None:
    engine = FakeEngine(poison="bad")
    engine.release.clear()

    async def body(b: MicroBatcher[str, str]) -> list[Any]:
        first = asyncio.ensure_future(b.submit("bad"))
        await asyncio.sleep(0.05)  # "bad" runs alone, blocked; the rest queue behind it
        rest = [asyncio.ensure_future(b.submit(f"ok{i}")) for i in range(5)]
        await asyncio.sleep(0.05)
        engine.release.set()
        return list(await asyncio.gather(first, *rest, return_exceptions=True))

    results = run(engine, BatchPolicy(), body)
    assert isinstance(results[0], RuntimeError)
    assert results[1:] == [f"ok{i}" * 2 for i in range(5)]


def test_a_full_queue_rejects_with_a_retry_hint() -> None:
    engine = FakeEngine()
    engine.release.clear()

    async def body(b: MicroBatcher[str, str]) -> None:
        running = asyncio.ensure_future(b.submit("running"))
        await asyncio.sleep(0.05)
        queued = [asyncio.ensure_future(b.submit(f"q{i}")) for i in range(2)]
        await asyncio.sleep(0.01)
        with pytest.raises(QueueFullError) as err:
            await b.submit("one too many")
        assert err.value.retry_after_s >= 1
        engine.release.set()
        assert await running == "runningrunning"
        assert [await q for q in queued] == ["q0q0", "q1q1"]

    run(engine, BatchPolicy(max_queue=2), body)
    assert "one too many" not in [x for batch in engine.batches for x in batch]


def test_a_request_past_its_deadline_is_dropped_before_compute() -> None:
    engine = FakeEngine()
    engine.release.clear()

    async def body(b: MicroBatcher[str, str]) -> None:
        running = asyncio.ensure_future(b.submit("running"))
        await asyncio.sleep(0.05)
        with pytest.raises(DeadlineExceededError):
            await b.submit("late", timeout_s=0.05)
        engine.release.set()
        await running

    run(engine, BatchPolicy(), body)
    assert all("late" not in batch for batch in engine.batches)


def test_a_deadline_passing_while_computing_still_gets_its_result() -> None:
    engine = FakeEngine()
    engine.release.clear()

    async def body(b: MicroBatcher[str, str]) -> None:
        computing = asyncio.ensure_future(b.submit("slow", timeout_s=0.05))
        await asyncio.sleep(0.15)  # taken by the engine before its deadline, which then passes
        assert not computing.done() and b.queue_depth == 0
        engine.release.set()
        assert await computing == "slowslow"

    run(engine, BatchPolicy(), body)


def test_a_caller_that_goes_away_has_its_queued_work_dropped() -> None:
    engine = FakeEngine()
    engine.release.clear()

    async def body(b: MicroBatcher[str, str]) -> None:
        running = asyncio.ensure_future(b.submit("running"))
        await asyncio.sleep(0.05)
        gone = asyncio.ensure_future(b.submit("gone"))
        stays = asyncio.ensure_future(b.submit("stays"))
        await asyncio.sleep(0.01)
        gone.cancel()
        await asyncio.sleep(0.01)
        assert b.queue_depth == 1
        engine.release.set()
        assert await running == "runningrunning"
        assert await stays == "staysstays"

    run(engine, BatchPolicy(), body)
    assert all("gone" not in batch for batch in engine.batches)


def test_close_drains_queued_work_and_then_refuses_new_work() -> None:
    engine = FakeEngine(delay_s=0.01)

    async def main() -> None:
        with ThreadPoolExecutor(max_workers=1) as executor:
            b: MicroBatcher[str, str] = MicroBatcher(
                engine, BatchPolicy(max_batch_size=2), cost=len, executor=executor
            )
            b.start()
            pending = [asyncio.ensure_future(b.submit(f"d{i}")) for i in range(6)]
            await asyncio.sleep(0)
            await b.close()
            assert [p.result() for p in pending] == [f"d{i}" * 2 for i in range(6)]
            with pytest.raises(BatcherClosedError):
                await b.submit("after close")

    asyncio.run(main())


def test_max_wait_fills_batches_only_under_load() -> None:
    engine = FakeEngine(delay_s=0.02)

    async def body(b: MicroBatcher[str, str]) -> None:
        first = asyncio.ensure_future(b.submit("a"))
        await asyncio.sleep(0.005)
        # These arrive while "a" runs: under load, the batcher may wait up to max_wait to fill the batch.
        tasks = [asyncio.ensure_future(b.submit(f"b{i}")) for i in range(3)]
        await asyncio.sleep(0.03)
        tasks += [asyncio.ensure_future(b.submit(f"c{i}")) for i in range(3)]
        await asyncio.gather(first, *tasks)

    run(engine, BatchPolicy(max_batch_size=8, max_wait_s=0.1), body)
    assert engine.batches[0] == ["a"]
    assert len(engine.batches) == 2  # b* and c* were collected into one batch by the wait


class CountingEngine(FakeEngine):
    """Also records the most batches it ever had in flight at once."""

    def __init__(self, delay_s: float) -> None:
        super().__init__(delay_s)
        self.active = 0
        self.most_active = 0
        self.lock = threading.Lock()

    def __call__(self, items: list[str]) -> list[str]:
        with self.lock:
            self.active += 1
            self.most_active = max(self.most_active, self.active)
        try:
            return super().__call__(items)
        finally:
            with self.lock:
                self.active -= 1


@pytest.mark.parametrize("concurrency", [1, 2, 3])
def test_instances_run_that_many_batches_at_once_and_no_more(concurrency: int) -> None:
    engine = CountingEngine(delay_s=0.05)
    items = [f"r{i}" for i in range(8)]

    async def body(b: MicroBatcher[str, str]) -> list[str]:
        return list(await asyncio.gather(*(b.submit(x) for x in items)))

    results = run(engine, BatchPolicy(max_batch_size=1), body, concurrency=concurrency)
    assert results == [x * 2 for x in items]
    assert engine.most_active == concurrency


def test_with_every_instance_busy_work_coalesces_and_close_waits_for_all() -> None:
    engine = FakeEngine(delay_s=0.02)
    engine.release.clear()
    stats: list[BatchStats] = []

    async def body(b: MicroBatcher[str, str]) -> list[str]:
        first = []
        for x in ("a", "b"):  # one after the other: each starts at once on an instance of its own, held there
            first.append(asyncio.create_task(b.submit(x)))
            await asyncio.sleep(0.02)
        rest = [asyncio.create_task(b.submit(f"q{i}")) for i in range(6)]  # queue behind them
        await asyncio.sleep(0.05)
        engine.release.set()
        return list(await asyncio.gather(*first, *rest))

    results = run(engine, BatchPolicy(max_batch_size=8), body, stats, concurrency=2)
    assert results == ["aa", "bb"] + [f"q{i}" * 2 for i in range(6)]
    assert sorted(len(batch) for batch in engine.batches)[:2] == [1, 1]
    assert len(engine.batches) == 3 and max(s.size for s in stats) == 6  # the queued six went together


def test_engine_threads_take_the_next_batch_without_waiting_for_the_event_loop() -> None:
    engine = FakeEngine(delay_s=0.01)

    async def body(b: MicroBatcher[str, str]) -> int:
        tasks = [asyncio.ensure_future(b.submit(f"r{i}")) for i in range(4)]
        await asyncio.sleep(0)  # one loop turn: all four are queued
        time.sleep(0.3)  # the loop is busy elsewhere (no turn of it runs) ...
        ran = len(engine.batches)  # ... yet every batch has run
        assert await asyncio.gather(*tasks) == [f"r{i}" * 2 for i in range(4)]
        return ran

    assert run(engine, BatchPolicy(max_batch_size=1), body) == 4


def test_shadow_items_never_share_a_batch_with_client_items_and_run_after_them() -> None:
    engine = FakeEngine()
    engine.release.clear()  # the first batch holds the engine while the rest queue

    async def body(b: MicroBatcher[str, str]) -> list[str]:
        first = asyncio.ensure_future(b.submit("c0"))
        await asyncio.sleep(0.05)  # c0 is in the engine, blocked
        shadows = [asyncio.ensure_future(b.submit(f"s{i}", shadow=True)) for i in range(2)]
        clients = [asyncio.ensure_future(b.submit(f"c{i}")) for i in range(1, 3)]
        await asyncio.sleep(0.01)
        engine.release.set()
        return list(await asyncio.gather(first, *clients, *shadows))

    results = run(engine, BatchPolicy(max_batch_size=8), body)
    assert results == ["c0c0", "c1c1", "c2c2", "s0s0", "s1s1"]
    # the shadows queued first, yet the client items went before them, and never in one batch with them
    assert engine.batches == [["c0"], ["c1", "c2"], ["s0", "s1"]]


def test_a_shadow_is_refused_while_a_batch_of_client_work_waits() -> None:
    engine = FakeEngine()
    engine.release.clear()

    async def body(b: MicroBatcher[str, str]) -> None:
        running = asyncio.ensure_future(b.submit("c"))
        await asyncio.sleep(0.05)
        waiting = [asyncio.ensure_future(b.submit(f"w{i}")) for i in range(2)]  # a full batch of 2 waits
        await asyncio.sleep(0)
        with pytest.raises(QueueFullError):
            await b.submit("s", shadow=True)
        engine.release.set()
        await asyncio.gather(running, *waiting)

    run(engine, BatchPolicy(max_batch_size=2), body)
    assert all("s" not in batch for batch in engine.batches)


def test_a_full_queue_drops_a_shadow_for_a_client_item_instead_of_a_429() -> None:
    engine = FakeEngine()
    engine.release.clear()

    async def body(b: MicroBatcher[str, str]) -> tuple[list[Any], str]:
        running = asyncio.ensure_future(b.submit("c"))
        await asyncio.sleep(0.05)
        shadows = [asyncio.ensure_future(b.submit(f"s{i}", shadow=True)) for i in range(2)]
        await asyncio.sleep(0)
        filler = asyncio.ensure_future(b.submit("f"))  # the queue (3) is now full: two shadows, one client
        await asyncio.sleep(0)
        client = asyncio.ensure_future(b.submit("x"))  # takes the newest shadow's place
        await asyncio.sleep(0)
        engine.release.set()
        outcomes = await asyncio.gather(*shadows, return_exceptions=True)
        await asyncio.gather(running, filler)
        return outcomes, await client

    outcomes, answer = run(engine, BatchPolicy(max_batch_size=4, max_queue=3), body)
    assert answer == "xx"
    assert outcomes[0] == "s0s0" and isinstance(outcomes[1], QueueFullError)


def test_shadows_wait_while_another_model_of_the_engine_has_client_work() -> None:
    """The models share the cores: a teacher's shadow batch waits for its student's clients to finish."""
    student, teacher = FakeEngine(), FakeEngine()
    student.release.clear()
    order: list[str] = []

    async def main() -> list[str]:
        clients = ClientWork()
        with ThreadPoolExecutor(max_workers=2) as executor:
            batchers = [
                MicroBatcher(engine, BatchPolicy(), cost=len, executor=executor, clients=clients)
                for engine in (student, teacher)
            ]
            for b in batchers:
                b.start()
            try:
                client = asyncio.ensure_future(batchers[0].submit("c"))
                await asyncio.sleep(0.05)  # the student's client item is running, held
                shadow = asyncio.ensure_future(batchers[1].submit("s", shadow=True))
                shadow.add_done_callback(lambda _: order.append("shadow"))
                client.add_done_callback(lambda _: order.append("client"))
                await asyncio.sleep(0.1)
                assert not shadow.done()  # the teacher is idle, yet its shadow waits
                student.release.set()
                return list(await asyncio.gather(client, shadow))
            finally:
                student.release.set()
                for b in batchers:
                    await b.close()

    assert asyncio.run(main()) == ["cc", "ss"]
    assert order == ["client", "shadow"]
