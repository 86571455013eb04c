"""A client's priority in the micro-batcher: the lowest queued leads the next batch, first come first served
within it, shadows stay behind every client item, and a full queue refuses what could wait rather than an
urgent arrival (service.batch_items: `leading`, `evicted_for`, `staying_for`; service.batching)."""

from __future__ import annotations

import asyncio
from typing import Any

from service.batch_items import Pending, evicted_for, leading, staying_for
from service.batch_policy import BatchPolicy, QueueFullError
from service.batching import MicroBatcher
from tests.service.test_batching import FakeEngine, run


def test_a_lower_priority_value_goes_first_and_arrival_order_holds_within_one() -> None:
    engine = FakeEngine()
    engine.release.clear()  # the first batch holds the engine while the rest queue

    async def body(b: MicroBatcher[str, str]) -> list[str]:
        first = asyncio.ensure_future(b.submit("a0"))
        await asyncio.sleep(0.05)  # a0 is in the engine, blocked
        patient = [asyncio.ensure_future(b.submit(f"p{i}", priority=5)) for i in range(2)]
        ordinary = asyncio.ensure_future(b.submit("o0"))
        hurried = [asyncio.ensure_future(b.submit(f"h{i}", priority=-1)) for i in range(2)]
        shadow = asyncio.ensure_future(b.submit("s0", shadow=True))
        await asyncio.sleep(0.01)
        engine.release.set()
        return list(await asyncio.gather(first, *patient, ordinary, *hurried, shadow))

    results = run(engine, BatchPolicy(max_batch_size=8), body)
    assert results == ["a0a0", "p0p0", "p1p1", "o0o0", "h0h0", "h1h1", "s0s0"]  # each caller its own
    # queued patient, ordinary, hurried, shadow: run hurried, ordinary, patient, then the shadow
    assert engine.batches == [["a0"], ["h0", "h1"], ["o0"], ["p0", "p1"], ["s0"]]


def test_without_priorities_the_batches_are_what_they_were() -> None:
    engine = FakeEngine()
    engine.release.clear()

    async def body(b: MicroBatcher[str, str]) -> None:
        first = asyncio.ensure_future(b.submit("a0"))
        await asyncio.sleep(0.05)
        rest = [asyncio.ensure_future(b.submit(f"c{i}")) for i in range(3)]
        await asyncio.sleep(0.01)
        engine.release.set()
        await asyncio.gather(first, *rest)

    run(engine, BatchPolicy(max_batch_size=8), body)
    assert engine.batches == [["a0"], ["c0", "c1", "c2"]]


def test_a_full_queue_refuses_the_newest_work_that_could_wait_not_a_more_urgent_arrival() -> None:
    engine = FakeEngine()
    engine.release.clear()

    async def body(b: MicroBatcher[str, str]) -> tuple[list[Any], str, BaseException | None]:
        running = asyncio.ensure_future(b.submit("r"))
        await asyncio.sleep(0.05)  # r holds the engine
        queued = [asyncio.ensure_future(b.submit(f"q{i}", priority=p)) for i, p in enumerate((0, 3, 3))]
        await asyncio.sleep(0)  # the queue (3) is full
        urgent = asyncio.ensure_future(b.submit("u", priority=-1))  # takes q2's place: newest of priority 3
        await asyncio.sleep(0)
        refused: BaseException | None = None
        try:
            b.check_room(2, priority=3)  # two rows of priority 3 find nothing that could make way
        except QueueFullError as e:
            refused = e
        b.check_room(3, priority=-2)  # three more urgent than all queued: room, by displacing them
        engine.release.set()
        outcomes = await asyncio.gather(*queued, return_exceptions=True)
        await running
        return outcomes, await urgent, refused

    outcomes, answer, refused = run(engine, BatchPolicy(max_batch_size=4, max_queue=3), body)
    assert answer == "uu" and isinstance(refused, QueueFullError)
    assert outcomes[:2] == ["q0q0", "q1q1"] and isinstance(outcomes[2], QueueFullError)


def queued(*kinds: tuple[str, int]) -> list[Pending[str, str]]:
    """Pending items in arrival order: ("c", priority) a client's, ("s", 0) a shadow."""
    return [
        Pending(f"{kind}{i}", 1, None, 0.0, None, i, shadow=kind == "s", priority=priority)  # type: ignore[arg-type]
        for i, (kind, priority) in enumerate(kinds)
    ]


def test_the_queues_precedence_rules() -> None:
    queue = queued(("c", 2), ("s", 0), ("c", -1), ("c", 2), ("c", -1))
    assert leading(queue) == [2, 4]  # the lowest priority value's client items, oldest first
    assert leading(queued(("s", 0), ("s", 0))) == [0, 1]  # shadows only when no client waits
    assert evicted_for(queue, 0) is queue[1]  # a shadow first, whatever the arrival
    no_shadow = queued(("c", 2), ("c", -1), ("c", 2))
    assert evicted_for(no_shadow, 0) is no_shadow[2]  # then the newest that could wait
    assert evicted_for(no_shadow, 2) is None  # nothing waits more patiently than the arrival
    no_shadow[2].taken = True  # an engine thread has it: it stays
    assert evicted_for(no_shadow, 0) is no_shadow[0]
    assert staying_for(queue, 0) == 2 and staying_for(queue, 2) == 4
