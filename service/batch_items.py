"""What a batcher holds for each item: where its result goes (`Outcome`: an asyncio future, or a `Ticket`
whose callback runs once) and its place in the queue (`Pending`: cost, deadline, order, priority), and the
queue's order of precedence: which items the next batch is chosen from (`leading`), and which leave, or
stay, when a full queue makes room (`evicted_for`, `staying_for`)."""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Sequence
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


def leading(queue: Sequence[Pending[Any, Any]]) -> list[int]:
    """Indices of the items the next batch is chosen from, oldest first: the client items of the lowest
    priority value queued, or the shadows when no client waits."""
    client = [i for i, p in enumerate(queue) if not p.shadow]
    if not client:
        return list(range(len(queue)))
    first = min(queue[i].priority for i in client)
    return [i for i in client if queue[i].priority == first]


def evicted_for(queue: Sequence[Pending[T, R]], priority: int) -> Pending[T, R] | None:
    """What leaves a full queue for a client item of `priority`: the newest still-queued shadow, else the
    newest client item of a higher priority value (work its client said could wait), else nothing."""
    queued = [p for p in reversed(queue) if not p.taken]
    shadow = next((p for p in queued if p.shadow), None)
    return shadow or next((p for p in queued if not p.shadow and p.priority > priority), None)


def staying_for(queue: Sequence[Pending[Any, Any]], priority: int) -> int:
    """Queued items that no arrival of `priority` can displace (`evicted_for`'s complement)."""
    return sum(not p.shadow and p.priority <= priority for p in queue)
