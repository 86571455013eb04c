"""What a batcher holds for each item: where its result goes (`Outcome`: an asyncio future, or a `Ticket`
whose callback runs once) and its place in the queue (`Pending`: cost, deadline, order, priority)."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Generic, Protocol, TypeVar

from service.batch_policy import ItemTiming

T = TypeVar("T")
R = TypeVar("R")
R_contra = TypeVar("R_contra", contravariant=True)


class Outcome(Protocol[R_contra]):
    """Where an item's result goes: an asyncio future (`submit`) or a `Ticket` (`enqueue`)."""

    def done(self) -> bool: ...

    def set_result(self, result: R_contra, /) -> None: ...

    def set_exception(self, error: BaseException, /) -> None: ...


class Ticket(Generic[R]):
    """An enqueued item's outcome, handed to a callback once (on the event loop)."""

    __slots__ = ("_callback", "_done", "pending", "timer")

    def __init__(self, callback: Callable[[R | None, BaseException | None], None]) -> None:
        self._callback = callback
        self._done = False
        self.pending: Pending[Any, R] | None = None
        self.timer: asyncio.TimerHandle | None = None

    def done(self) -> bool:
        return self._done

    def set_result(self, result: R, /) -> None:
        if self._finish():
            self._callback(result, None)

    def set_exception(self, error: BaseException, /) -> None:
        if self._finish():
            self._callback(None, error)

    def cancel(self) -> None:
        self._finish()

    def _finish(self) -> bool:
        if self._done:
            return False
        self._done = True
        if self.timer is not None:
            self.timer.cancel()
        return True


@dataclass(eq=False)
class Pending(Generic[T, R]):
    """One queued item: what it costs, when it expires, its order of arrival, and whether a batch took it."""

    item: T
    cost: int
    future: Outcome[R]
    enqueued_at: float
    deadline: float | None
    seq: int
    taken: bool = False
    timing: ItemTiming | None = None
    shadow: bool = False  # lowest priority (see the module's docstring)
    priority: int = 0  # a client item's: the lowest present leads the next batch (service.batching)
