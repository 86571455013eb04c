"""The generic async micro-batcher: it knows items, costs and a `run_batch` callable; nothing of HTTP or ONNX.

Principles (see ARCHITECTURE.md): never wait when the engine is idle; coalesce what queued while it was
busy; cap a batch by count and by padded tokens; group similar lengths; bound the queue; drop work whose
deadline passed or whose caller went away before compute; run the engine off the event loop, up to
`concurrency` batches at once (Triton's instance count), each engine thread taking its own next batch.

A client item carries its request's `priority` (vLLM's meaning: lower first, default 0): each batch is chosen
among the client items of the lowest priority queued, oldest first, so a request that asks for it passes
ahead of earlier work in the student's queue and its unsure inputs in the teacher's; lower priorities can wait
indefinitely behind a steady stream of higher ones, until their deadline answers them.

Shadow items (a teacher checking its student's answers, service.shadow) have the lowest priority, across
every model of the engine (they share its cores: a teacher's shadow batch slows its student's clients as
much as its own): one is refused at once while a batch's worth of client work waits in any batcher of the
`ClientWork` group; shadows never share a batch with client items (on a CPU every row a batch carries
lengthens it), run only while no client item is queued or running anywhere in the group, at most
SHADOW_BATCH at a time (what a client arriving meanwhile may wait behind); and a shadow is the first to go
when the queue is full: a client item takes its place instead of getting a 429.

An optional `BatchPlanner` (service.latency_target) picks each batch's caps and wait from what the engine's
batches cost, instead of the policy's fixed ones. An optional `trace_batch` (service.tracing) is handed each
engine call that carried a traced item (`ItemTiming.traced`) and returns a reference to the call's span, which
goes back on those items' timings.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import threading
import time
from collections.abc import Awaitable, Callable, Iterable, Sequence
from concurrent.futures import Executor
from typing import Any, Generic, TypeVar

from service.batch_items import Outcome, Pending, Ticket, evicted_for, leading, staying_for
from service.batch_policy import (
    BatchCaps,
    BatcherClosedError,
    BatchPlanner,
    BatchPolicy,
    BatchStats,
    DeadlineExceededError,
    ItemTiming,
    QueueFullError,
    QueueTooSmallError,
    select_batch,
)

T = TypeVar("T")
R = TypeVar("R")
R_contra = TypeVar("R_contra", contravariant=True)

log = logging.getLogger(__name__)


_BATCH_IDS = itertools.count()  # process-wide, so engine calls of different models never share an id
SHADOW_BATCH = 8  # most shadow items in one engine call
SHADOW_QUEUE_BATCHES = 4  # shadow items a batcher queues, in batches (a QA check is a window per row)
SHADOW_POLL_S = 0.002  # how often an engine thread holding only shadows looks whether clients are gone


class ClientWork:
    """The batchers of one engine (whose models share its cores): is any client item queued or running?"""

    def __init__(self) -> None:
        self.batchers: list[MicroBatcher[Any, Any]] = []

    def queued(self) -> int:
        return sum(b.client_queued for b in self.batchers)

    def busy(self) -> bool:
        return any(b.client_queued or b.client_running for b in self.batchers)


class MicroBatcher(Generic[T, R]):
    """Coalesces concurrent `submit()` calls into `run_batch(items)` calls on `concurrency` engine threads.

    Each engine thread takes its next batch itself, the moment the previous one is done, and hands the
    results to the event loop; the loop only queues requests and wakes them. (Handed out from the loop, a
    batch waited a loop turn to start and another to be collected, behind every other request's callbacks:
    at 64 clients the demo student's engine calls took 12 ms and came back to their requests after 17-19, and
    the engines idled ~40 % of the time.) `run_batch` gets items in a list and must return one result per
    item, in order; it is called from `concurrency` threads at once, each a long-lived task on `executor`,
    which must have that many. `cost(item)` is its token count (padded cost = batch size x the largest).
    """

    def __init__(
        self,
        run_batch: Callable[[list[T]], Sequence[R]],
        policy: BatchPolicy,
        *,
        cost: Callable[[T], int],
        executor: Executor,
        concurrency: int = 1,
        on_batch: Callable[[BatchStats], None] | None = None,
        on_queue_depth: Callable[[int], None] | None = None,
        clients: ClientWork | None = None,
        planner: BatchPlanner | None = None,
        trace_batch: Callable[[BatchStats], str] | None = None,
    ) -> None:
        if concurrency < 1:
            raise ValueError(f"concurrency must be >= 1, got {concurrency}")
        self._run_batch = run_batch
        self.policy = policy
        self._cost = cost
        self._executor = executor
        self.concurrency = concurrency
        self._on_batch = on_batch
        self._on_queue_depth = on_queue_depth
        self._planner = planner
        self._trace_batch = trace_batch  # tracing on: a span for each call carrying a traced item
        self._queue: list[Pending[T, R]] = []  # changed under the lock only: the loop and the engine threads
        self._work = threading.Condition(threading.Lock())
        self._seq = itertools.count()
        self._closing = False
        self._loop: asyncio.AbstractEventLoop | None = None
        self._threads: list[asyncio.Future[None]] = []
        self._last_run_s = 0.0
        self._last_batch_size = 1
        self._shadow_queued = 0  # shadow items in the queue (changed under the lock)
        self.client_running = 0  # client items in engine calls now
        self.clients = clients if clients is not None else ClientWork()
        self.clients.batchers.append(self)

    # -- public (event loop) ---------------------------------------------------------------------------------

    def start(self) -> None:
        if not self._threads:
            self._loop = asyncio.get_running_loop()
            self._threads = [
                self._loop.run_in_executor(self._executor, self._serve) for _ in range(self.concurrency)
            ]
            for thread in self._threads:
                thread.add_done_callback(self._thread_ended)

    async def close(self) -> None:
        """Stop taking work, finish what is queued and in flight, then stop."""
        with self._work:
            self._closing = True
            self._work.notify_all()
        if self._threads:
            # Each thread posted its last results before it ended: they are out before this returns.
            await asyncio.gather(*self._threads, return_exceptions=True)
            self._threads = []

    @property
    def queue_depth(self) -> int:
        return len(self._queue)

    @property
    def client_queued(self) -> int:
        return len(self._queue) - self._shadow_queued

    def check_room(self, count: int, priority: int = 0) -> None:
        """Refuse `count` items together unless the queue can hold them all (a request's windows or texts:
        queueing some of them and refusing the rest computes for nobody); shadows, and client items of a
        higher priority value than `priority`, make room (batch_items.evicted_for)."""
        if count > self.policy.max_queue:
            raise QueueTooSmallError(
                f"{count} sequences at once; the queue holds at most {self.policy.max_queue}"
            )
        if len(self._queue) + count <= self.policy.max_queue:
            return
        if staying_for(self._queue, priority) + count > self.policy.max_queue:
            raise QueueFullError(self._retry_after_s())

    async def submit(
        self,
        item: T,
        timeout_s: float | None = None,
        timing: ItemTiming | None = None,
        shadow: bool = False,
        priority: int = 0,
    ) -> R:
        loop = asyncio.get_running_loop()
        future: asyncio.Future[R] = loop.create_future()
        pending = self._enqueue(item, future, timeout_s, timing, shadow, priority)
        # One timer, not wait_for(shield(...)): those cost two extra futures and a task switch per item.
        timer = None if timeout_s is None else loop.call_later(timeout_s, self._expire, pending, timeout_s)
        try:
            return await future
        except asyncio.CancelledError:
            # The caller went away (client disconnect): never compute for nobody.
            self._remove(pending)
            future.cancel()
            raise
        finally:
            if timer is not None:
                timer.cancel()

    def enqueue(
        self,
        item: T,
        callback: Callable[[R | None, BaseException | None], None],
        timeout_s: float | None = None,
        timing: ItemTiming | None = None,
        shadow: bool = False,
        priority: int = 0,
    ) -> Ticket[R]:
        """Queue `item` and call `callback(result, None)` or `callback(None, error)` on the loop when it is
        done: `submit` without a task or a future (the engine core answers each request this way)."""
        ticket: Ticket[R] = Ticket(callback)
        ticket.pending = self._enqueue(item, ticket, timeout_s, timing, shadow, priority)
        if timeout_s is not None:
            loop = asyncio.get_running_loop()
            ticket.timer = loop.call_later(timeout_s, self._expire, ticket.pending, timeout_s)
        return ticket

    def withdraw(self, ticket: Ticket[R]) -> None:
        """The caller went away: a still-queued item leaves before compute; its callback is not called."""
        if ticket.pending is not None:
            self._remove(ticket.pending)
        ticket.cancel()

    def _enqueue(
        self,
        item: T,
        outcome: Outcome[R],
        timeout_s: float | None,
        timing: ItemTiming | None,
        shadow: bool = False,
        priority: int = 0,
    ) -> Pending[T, R]:
        if self._closing:
            raise BatcherClosedError("the server is shutting down and takes no new work")
        if shadow:
            self._admit_shadow()
        elif len(self._queue) >= self.policy.max_queue and not self._evict_for(priority):
            raise QueueFullError(self._retry_after_s())
        now = time.monotonic()
        pending = Pending(
            item=item,
            cost=max(1, self._cost(item)),
            future=outcome,
            enqueued_at=now,
            deadline=None if timeout_s is None else now + timeout_s,
            seq=next(self._seq),
            timing=timing,
            shadow=shadow,
            priority=priority,
        )
        with self._work:
            if self._closing:  # again under the lock: engine threads stop once they see it and no work
                raise BatcherClosedError("the server is shutting down and takes no new work")
            self._queue.append(pending)
            self._shadow_queued += shadow
            self._work.notify()
        self._report_depth()
        return pending

    def _admit_shadow(self) -> None:
        """A shadow item waits only behind less than a batch of client work (in the whole engine), beside
        less than SHADOW_QUEUE_BATCHES batches of other shadows, and never fills the queue's last place."""
        size = self.policy.max_batch_size
        if (
            self._shadow_queued >= SHADOW_QUEUE_BATCHES * size
            or len(self._queue) >= self.policy.max_queue
            or self.clients.queued() >= size
        ):
            raise QueueFullError(self._retry_after_s())

    def _evict_for(self, priority: int) -> bool:
        """The queue is full: what batch_items.evicted_for picks leaves, refused (429), so that the 429s of
        a full queue fall on shadows, then on the work its clients said could wait."""
        with self._work:
            victim = evicted_for(self._queue, priority)
            if victim is None:
                return False
            self._queue.remove(victim)
            self._shadow_queued -= victim.shadow
        if not victim.future.done():
            victim.future.set_exception(QueueFullError(self._retry_after_s()))
        return True

    def _expire(self, pending: Pending[T, R], timeout_s: float) -> None:
        """The deadline passed: a queued item is dropped with a 504; one already computing is waited for."""
        if self._remove(pending) and not pending.future.done():
            pending.future.set_exception(DeadlineExceededError(f"not started within {timeout_s:g} s"))

    def _remove(self, pending: Pending[T, R]) -> bool:
        """Take a still-queued item out; False when an engine thread has already taken it."""
        with self._work:
            if pending.taken or pending not in self._queue:
                return False
            self._queue.remove(pending)
            self._shadow_queued -= pending.shadow
        self._report_depth()
        return True

    @staticmethod
    def _thread_ended(thread: asyncio.Future[None]) -> None:
        if not thread.cancelled() and thread.exception() is not None:  # a bug outside run_batch: say so
            log.error("micro-batcher: an engine thread failed", exc_info=thread.exception())

    # -- the engine threads ------------------------------------------------------------------------------

    def _serve(self) -> None:
        """One engine instance: take a batch, run it, post its results to the loop; until closed and empty."""
        under_load = False
        while (batch := self._next_batch(under_load)) is not None:
            started = time.monotonic()
            failure: Exception | None = None
            results: Sequence[R] = ()
            clients = 0 if batch[0].shadow else len(batch)  # a batch is all client items or all shadows
            try:
                results = self._run_batch([p.item for p in batch])
                if len(results) != len(batch):
                    raise RuntimeError(f"run_batch returned {len(results)} results for {len(batch)} items")
            except Exception as e:  # a failing batch fails only its own requests
                failure = e
            finally:
                with self._work:
                    self.client_running -= clients
            self._last_run_s, self._last_batch_size = time.monotonic() - started, len(batch)
            # Work that queued while the engine ran means load: only then may max_wait apply.
            under_load = bool(self._queue)
            self._post(self._resolve, batch, results, failure, started, self._last_run_s)

    def _next_batch(self, under_load: bool) -> list[Pending[T, R]] | None:
        with self._work:
            while True:
                self._drop_stale()
                if self._queue and not self.client_queued and self.clients.busy():
                    self._work.wait(SHADOW_POLL_S)  # only shadows here, clients busy elsewhere: yield
                    continue
                if self._queue:
                    caps = self._caps()
                    if under_load and caps.max_wait_s > 0:
                        self._wait_for_fuller_batch(caps)
                        self._drop_stale()
                        if not self._queue:
                            continue
                        caps = self._caps()  # the oldest has waited meanwhile
                    return self._take_batch(caps)
                if self._closing:
                    return None
                self._work.wait()

    def _caps(self) -> BatchCaps:
        """The next batch's caps: the policy's, or the planner's for the batch the oldest item leads (the
        oldest client item, as a batch of shadows runs only when no client waits; the lock is held)."""
        policy = self.policy
        if self._planner is None:
            return BatchCaps(policy.max_batch_size, policy.max_batch_tokens, policy.max_wait_s)
        oldest = self._queue[leading(self._queue)[0]]
        return self._planner.caps(policy, time.monotonic() - oldest.enqueued_at, oldest.cost)

    def _wait_for_fuller_batch(self, caps: BatchCaps) -> None:
        """Under load only: give the queue up to max_wait to fill a batch (the lock is held)."""
        deadline = time.monotonic() + caps.max_wait_s
        while len(self._queue) < caps.max_size and not self._closing:
            remaining = deadline - time.monotonic()
            if remaining <= 0 or not self._work.wait(remaining):
                return

    def _take_batch(self, caps: BatchCaps) -> list[Pending[T, R]]:
        items = self._queue
        pool = leading(items)  # shadows alone only when no client waits
        client = not items[pool[0]].shadow
        indices = [
            pool[j]
            for j in select_batch(
                [items[i].cost for i in pool],
                caps.max_size if client else min(caps.max_size, SHADOW_BATCH),
                caps.max_tokens,
                self.policy.min_padding_efficiency,
            )
        ]
        chosen = [items[i] for i in indices]
        keep = set(indices)
        self._queue = [p for i, p in enumerate(items) if i not in keep]
        if client:
            self.client_running += len(chosen)
        else:
            self._shadow_queued -= len(chosen)
        for p in chosen:
            p.taken = True
        self._report_depth()
        return chosen

    def _drop_stale(self) -> None:
        """Remove work nobody waits for any more, or whose deadline has passed (the loop answers those)."""
        now = time.monotonic()
        stale = [p for p in self._queue if p.future.done() or (p.deadline is not None and now >= p.deadline)]
        if stale:
            self._queue = [p for p in self._queue if p not in stale]
            self._shadow_queued -= sum(p.shadow for p in stale)
            self._report_depth()
            for p in stale:
                self._post(self._fail_late, p)

    def _post(self, callback: Callable[..., None], *args: Any) -> None:
        assert self._loop is not None
        self._loop.call_soon_threadsafe(callback, *args)

    # -- results, back on the event loop -----------------------------------------------------------------

    def _resolve(
        self,
        batch: list[Pending[T, R]],
        results: Sequence[R],
        failure: Exception | None,
        started: float,
        run_s: float,
    ) -> None:
        batch_id = next(_BATCH_IDS)
        traced = self._trace_batch is not None and any(
            p.timing is not None and p.timing.traced for p in batch
        )
        stats = None
        if self._on_batch is not None or self._planner is not None or traced:
            costs = [p.cost for p in batch]
            stats = BatchStats(
                size=len(batch),
                real_tokens=sum(costs),
                padded_tokens=max(costs) * len(batch),
                queue_wait_s=[started - p.enqueued_at for p in batch],
                run_s=run_s,
                failed=failure is not None,
                started_s=started,
                batch=batch_id,
            )
        span = self._traced(stats) if traced and stats is not None else ""
        for i, p in enumerate(batch):
            if p.timing is not None:  # before the futures resolve: a caller sees its times as it wakes
                p.timing.queue_s = started - p.enqueued_at
                p.timing.run_s = run_s
                p.timing.batch = batch_id
                if p.timing.traced:
                    p.timing.batch_span = span
            if p.future.done():
                continue
            if failure is not None:
                p.future.set_exception(failure)
            else:
                p.future.set_result(results[i])
        if stats is not None:
            if self._planner is not None:
                self._planner.observe(stats)
            if self._on_batch is not None:
                self._on_batch(stats)

    def _traced(self, stats: BatchStats) -> str:
        """The batch's span (its reference), or "" when making it failed: tracing never fails a batch."""
        assert self._trace_batch is not None
        try:
            return self._trace_batch(stats)
        except Exception:
            log.exception("micro-batcher: tracing an engine call failed")
            return ""

    @staticmethod
    def _fail_late(pending: Pending[T, R]) -> None:
        if not pending.future.done():
            pending.future.set_exception(DeadlineExceededError("deadline passed while queued"))

    # -- helpers ------------------------------------------------------------------------------------------

    def _report_depth(self) -> None:
        if self._on_queue_depth is not None:
            self._on_queue_depth(len(self._queue))

    def _retry_after_s(self) -> float:
        """Roughly how long the queue takes to drain at the last batch's size and speed (batches of long
        sequences hold fewer than max_batch_size: the token cap and length grouping cut them)."""
        batches = len(self._queue) / (self._last_batch_size * self.concurrency)
        return max(1.0, batches * self._last_run_s)


async def all_or_none(work: Iterable[Awaitable[T]]) -> list[T]:
    """Await them together; when one fails (429, 504) or the request is cancelled (client gone), cancel
    the rest and wait until they have left their queues: a request's work is never computed for nobody."""
    tasks = [asyncio.ensure_future(w) for w in work]
    try:
        return list(await asyncio.gather(*tasks))
    except BaseException:
        for task in tasks:
            task.cancel()
        await asyncio.wait(tasks)
        raise
