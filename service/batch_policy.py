"""What a batch is and how the next one is chosen, apart from the batcher that forms them (service.batching):
the policy and one batch's caps, what an engine call looked like (`BatchStats`) and what one item went
through (`ItemTiming`), a planner's interface (service.latency_target), the queue's refusals, and
`select_batch`, the rule that picks the next batch from the queue by length.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol


class QueueFullError(Exception):
    """The queue is at its bound; the caller should retry later (HTTP 429)."""

    def __init__(self, retry_after_s: float) -> None:
        super().__init__(f"queue is full; retry in {retry_after_s:.1f} s")
        self.retry_after_s = retry_after_s


class DeadlineExceededError(Exception):
    """The request's deadline passed before it reached the engine (HTTP 504)."""


class BatcherClosedError(Exception):
    """The batcher is draining for shutdown and takes no new work (HTTP 503)."""


class QueueTooSmallError(ValueError):
    """A request needs more sequences at once than the whole queue holds: never servable (HTTP 422)."""


@dataclass(frozen=True)
class BatchPolicy:
    max_batch_size: int = 32
    max_batch_tokens: int = 8192
    max_wait_s: float = 0.0
    max_queue: int = 1024
    min_padding_efficiency: float = 0.0  # real / padded tokens a batch must keep (0: any mix of lengths)


@dataclass(frozen=True)
class BatchCaps:
    """The caps of one batch: the policy's fixed ones, or a planner's for the queue as it is now."""

    max_size: int
    max_tokens: int
    max_wait_s: float


@dataclass(frozen=True)
class BatchStats:
    """What one engine call looked like, for metrics (and a traced batch's span, service.tracing)."""

    size: int
    real_tokens: int
    padded_tokens: int
    queue_wait_s: list[float]
    run_s: float
    failed: bool
    started_s: float = 0.0  # when the call began (time.monotonic)
    batch: int = -1  # which engine call (ItemTiming.batch)


@dataclass
class ItemTiming:
    """Filled in for one submitted item, for callers that account per request (access logs, traces)."""

    queue_s: float | None = None
    run_s: float | None = None
    batch: int | None = None  # which engine call (unique per process): a request's items may share one
    traced: bool = False  # set by the caller: a sampled request's item, whose engine call gets a span
    batch_span: str = ""  # that span, for the request's link to it (service.tracing.span_ref)


class BatchPlanner(Protocol):
    """Picks the next batch's caps (on an engine thread, under the batcher's lock: keep it cheap) and
    learns from each batch run (on the event loop)."""

    def caps(self, policy: BatchPolicy, oldest_age_s: float, oldest_cost: int) -> BatchCaps: ...

    def observe(self, stats: BatchStats) -> None: ...


def select_batch(
    costs: Sequence[int], max_size: int, max_tokens: int, min_efficiency: float = 0.0
) -> list[int]:
    """Indices (into FIFO-ordered costs) of the next batch.

    The oldest item always goes (no starvation); it is joined by the items closest to it in length, as long
    as the batch stays within `max_size`, `size x longest <= max_tokens`, and real tokens / padded tokens
    >= `min_efficiency`. Padding is paid to the batch's longest item, so grouping by length is what keeps
    batching free; an item that would cost too much padding waits for a batch of its own length.
    """
    if not costs:
        return []
    anchor = costs[0]
    chosen = [0]
    longest, real = anchor, anchor
    by_closeness = sorted(range(1, len(costs)), key=lambda i: (abs(costs[i] - anchor), i))
    for i in by_closeness:
        if len(chosen) >= max_size:
            break
        new_longest = max(longest, costs[i])
        padded = new_longest * (len(chosen) + 1)
        if padded > max_tokens or (real + costs[i]) < min_efficiency * padded:
            continue
        chosen.append(i)
        longest, real = new_longest, real + costs[i]
    return sorted(chosen)
