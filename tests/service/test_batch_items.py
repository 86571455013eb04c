"""A batcher's items: a Ticket hands its outcome to its callback once, and `enqueue` answers through one."""

from __future__ import annotations

import asyncio
from collections.abc import Callable

from service.batch_items import Ticket
from service.batch_policy import BatchPolicy, DeadlineExceededError
from service.batching import MicroBatcher
from tests.service.test_batching import FakeEngine, run


def test_a_ticket_calls_back_once_and_not_at_all_once_cancelled() -> None:
    calls: list[tuple[object, object]] = []
    ticket: Ticket[str] = Ticket(lambda result, error: calls.append((result, error)))
    ticket.set_result("first")
    ticket.set_result("second")  # a late answer (the deadline's, or the engine's) is dropped
    ticket.set_exception(RuntimeError("late"))
    assert calls == [("first", None)] and ticket.done()

    async def cancelled() -> bool:
        silent: Ticket[str] = Ticket(lambda result, error: calls.append((result, error)))
        silent.timer = asyncio.get_running_loop().call_later(60, lambda: None)
        silent.cancel()
        silent.set_result("never seen")
        return silent.timer.cancelled()

    assert asyncio.run(cancelled()) and calls == [("first", None)]


def test_enqueued_items_answer_through_their_callbacks_or_their_deadline() -> None:
    engine = FakeEngine()
    answers: dict[str, tuple[str | None, BaseException | None]] = {}

    async def body(batcher: MicroBatcher[str, str]) -> None:
        answered = {name: asyncio.Event() for name in ("first", "late")}

        def answer(name: str) -> Callable[[str | None, BaseException | None], None]:
            def callback(result: str | None, error: BaseException | None) -> None:
                answers[name] = (result, error)
                answered[name].set()

            return callback

        engine.release.clear()  # the engine holds the first item's batch ...
        batcher.enqueue("first", answer("first"), timeout_s=0.01)
        await asyncio.sleep(0.05)
        batcher.enqueue("late", answer("late"), timeout_s=0.01)  # ... so this one waits in the queue
        await asyncio.wait_for(answered["late"].wait(), 5)
        engine.release.set()
        await asyncio.wait_for(answered["first"].wait(), 5)

    run(engine, BatchPolicy(max_batch_size=4), body)
    assert answers["first"] == ("firstfirst", None)  # past its deadline, but computing: waited for
    result, error = answers["late"]
    assert result is None and isinstance(error, DeadlineExceededError)  # never started: dropped
