"""Per-request accounting: the batcher fills each item's timing; the request's exchange sums it up."""

from __future__ import annotations

import asyncio
import time
from concurrent.futures import ThreadPoolExecutor

from service.batch_policy import BatchPolicy, ItemTiming
from service.batching import MicroBatcher
from service.exchange import SCOPE_KEY, Exchange, exchange_of


def test_the_batcher_fills_each_items_timing() -> None:
    def slow_double(items: list[str]) -> list[str]:
        time.sleep(0.05)
        return [i * 2 for i in items]

    async def main() -> list[ItemTiming]:
        with ThreadPoolExecutor(max_workers=1) as executor:
            batcher: MicroBatcher[str, str] = MicroBatcher(
                slow_double, BatchPolicy(max_batch_size=2), cost=len, executor=executor
            )
            batcher.start()
            timings = [ItemTiming() for _ in range(3)]
            first = asyncio.ensure_future(batcher.submit("ab", timing=timings[0]))
            await asyncio.sleep(0.01)  # the idle engine takes it at once; the next two queue behind it
            results = await asyncio.gather(first, *(batcher.submit("ab", timing=t) for t in timings[1:]))
            await batcher.close()
            assert results == ["abab"] * 3
            return timings

    first, second, third = asyncio.run(main())
    assert first.batch != second.batch == third.batch
    assert all(t.run_s is not None and t.run_s >= 0.05 for t in (first, second, third))
    assert first.queue_s is not None and first.queue_s < 0.05
    assert second.queue_s is not None and second.queue_s >= 0.02  # waited for the first batch


def test_the_exchange_takes_the_longest_wait_and_each_engine_call_once() -> None:
    context = Exchange()
    context.add_item(ItemTiming(queue_s=0.010, run_s=0.100, batch=1))
    context.add_item(ItemTiming(queue_s=0.030, run_s=0.100, batch=1))
    context.add_item(ItemTiming(queue_s=0.020, run_s=0.050, batch=2))
    context.add_item(ItemTiming())  # refused before it reached the engine
    assert context.queue_s == 0.030
    assert context.inference_s is not None and abs(context.inference_s - 0.150) < 1e-9


def test_the_exchange_is_the_one_the_middleware_opened_or_a_fresh_one_kept_for_the_request() -> None:
    opened = Exchange(request_id="r1")
    assert exchange_of({SCOPE_KEY: opened}) is opened
    bare: dict[str, object] = {}
    fresh = exchange_of(bare)
    assert fresh.request_id == "" and exchange_of(bare) is fresh
