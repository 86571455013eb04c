"""Submitting a request's items: all of them are queued or none, and they leave the queue together."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Awaitable, Callable
from concurrent.futures import ThreadPoolExecutor
from types import SimpleNamespace
from typing import cast

import pytest

from service.batch_policy import BatchPolicy, QueueFullError
from service.batching import MicroBatcher, all_or_none
from service.exchange import Exchange
from service.served import LocalEncoder, ServedModel
from service.tasks.common import run_all
from service.tasks.contract import InvalidInputError

Body = Callable[[ServedModel, MicroBatcher[str, str], threading.Event], Awaitable[None]]


def with_busy_engine(body: Body, max_queue: int = 4) -> list[str]:
    """Run `body` while the engine holds one item (the queue empty) until released; what it computed."""
    release = threading.Event()
    computed: list[str] = []

    def engine(items: list[str]) -> list[str]:
        release.wait(5)
        computed.extend(items)
        return items

    async def main() -> None:
        with ThreadPoolExecutor(max_workers=1) as executor:
            policy = BatchPolicy(max_batch_size=1, max_queue=max_queue)
            batcher: MicroBatcher[str, str] = MicroBatcher(engine, policy, cost=len, executor=executor)
            batcher.start()
            try:
                busy = asyncio.ensure_future(batcher.submit("busy"))
                await asyncio.sleep(0.05)
                await body(
                    cast(ServedModel, SimpleNamespace(encoding=LocalEncoder(batcher))), batcher, release
                )
                release.set()
                assert await busy == "busy"
            finally:
                release.set()
                await batcher.close()

    asyncio.run(asyncio.wait_for(main(), 10))
    return computed


def test_items_the_queue_cannot_all_hold_now_are_refused_before_any_is_queued() -> None:
    async def body(model: ServedModel, batcher: MicroBatcher[str, str], release: threading.Event) -> None:
        waiting = [asyncio.ensure_future(batcher.submit(f"q{i}")) for i in range(2)]
        await asyncio.sleep(0.01)
        with pytest.raises(QueueFullError):
            await run_all(model, ["w0", "w1", "w2"], timeout_s=5, x=Exchange())
        assert batcher.queue_depth == 2
        fits = asyncio.ensure_future(run_all(model, ["a", "b"], timeout_s=5, x=Exchange()))
        await asyncio.sleep(0.01)
        release.set()
        assert await fits == ["a", "b"]
        assert [await w for w in waiting] == ["q0", "q1"]

    assert with_busy_engine(body) == ["busy", "q0", "q1", "a", "b"]


def test_a_request_larger_than_the_whole_queue_is_told_it_never_fits() -> None:
    async def body(model: ServedModel, batcher: MicroBatcher[str, str], _: threading.Event) -> None:
        with pytest.raises(InvalidInputError, match=r"needs 5 sequences at once; .* at most 4 .*MAX_QUEUE"):
            await run_all(model, [f"w{i}" for i in range(5)], timeout_s=5, x=Exchange())

    assert with_busy_engine(body) == ["busy"]


def test_a_cancelled_request_takes_all_its_items_out_of_the_queue() -> None:
    async def body(model: ServedModel, batcher: MicroBatcher[str, str], _: threading.Event) -> None:
        request = asyncio.ensure_future(run_all(model, ["w0", "w1", "w2"], timeout_s=5, x=Exchange()))
        await asyncio.sleep(0.01)
        assert batcher.queue_depth == 3
        request.cancel()
        with pytest.raises(asyncio.CancelledError):
            await request
        assert batcher.queue_depth == 0

    assert with_busy_engine(body) == ["busy"]


def test_all_or_none_cancels_the_rest_when_one_fails_and_waits_until_they_are_gone() -> None:
    left: list[str] = []

    async def slow(name: str) -> str:
        try:
            await asyncio.sleep(10)
        finally:
            left.append(name)  # runs on cancellation: what leaving a queue would do
        return name

    async def fails() -> str:
        await asyncio.sleep(0.01)
        raise QueueFullError(retry_after_s=1.0)

    async def main() -> None:
        with pytest.raises(QueueFullError):
            await all_or_none([slow("a"), fails(), slow("b")])
        assert sorted(left) == ["a", "b"]  # gone before the error reached the caller
        assert await all_or_none([asyncio.sleep(0, result=i) for i in range(3)]) == [0, 1, 2]

    asyncio.run(asyncio.wait_for(main(), 5))
