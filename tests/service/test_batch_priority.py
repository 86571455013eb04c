"""A client's priority in the micro-batcher: the lowest queued leads the next batch, first come first served
within it, and shadows stay behind every client item (service.batching, `MicroBatcher._leading`)."""

from __future__ import annotations

import asyncio

from service.batch_policy import BatchPolicy
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
