"""One HTTP request and its answer, as one record the layers hand each other by name.

The outermost middleware (service.api.access) opens an `Exchange` per request with its id and the server's
text limits and keeps it in the ASGI scope, the place ASGI gives per-request data. A route takes it from
there once (`exchange_of`) and passes it, as an argument, to the task that serves it: the task names the
model it chose, what the request cost (tokenize, queue and engine time) and how many of its inputs were
truncated. When the answer is sent the middleware reads it back for the response headers, the access line,
the request metrics and the model's statistics. Outside HTTP (unit tests, the bare reference server) a
caller makes its own `Exchange()`.
"""

from __future__ import annotations

from collections.abc import MutableMapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal

from service.batch_policy import ItemTiming

if TYPE_CHECKING:
    from service.stats import ModelStats

Truncation = Literal["truncate", "reject"]
SCOPE_KEY = "distilserve.exchange"


@dataclass(frozen=True)
class TextLimits:
    """The server's rules for one text: its raw length, and what to do past the model's window."""

    max_chars: int = 100_000
    truncation: Truncation = "truncate"


Attribute = str | int | float
Event = tuple[str, float, dict[str, Attribute]]  # name, when (perf_counter seconds), attributes


@dataclass(frozen=True, slots=True)
class Phase:
    """A stretch of a traced request (tokenize, queue, an engine call, post-process, a generation's prefill
    and decode), in perf_counter seconds; service.tracing makes it a span once the request is answered.
    `links`: spans it points at (an engine call's batch span, as `service.tracing.span_ref` writes them);
    `events`: moments inside it."""

    name: str
    start_s: float
    end_s: float
    attributes: dict[str, Attribute] = field(default_factory=dict)
    links: tuple[str, ...] = ()
    events: tuple[Event, ...] = ()


@dataclass(slots=True)
class Exchange:
    request_id: str = ""
    limits: TextLimits = field(default_factory=TextLimits)
    model: str = ""  # the served model's name, once the route has chosen it ("" : none was)
    task: str = ""
    stats: ModelStats | None = None  # where the request's statistics go (the object: no lookup per request)
    items: int = 1  # the request's batch (texts, pairs or prompts), once the route has checked its size
    tokenize_s: float | None = None
    queue_s: float | None = None  # the longest wait of the request's items: they queue side by side
    inference_s: float | None = None  # the engine calls the request took part in, each counted once
    truncated: int | None = None  # None: nothing was checked against a window (no header)
    answered_by: tuple[str, ...] = ()  # the models whose answers the response holds (service.cascade)
    teacher_busy: int = 0  # unsure inputs whose student answer stood: the teacher could not take them
    start_by_s: float | None = None  # time.monotonic() by which engine work must start, else a 504 (a budget)
    shadow: bool = False  # a teacher's check of its student's answers, off any client's path
    priority: int = 0  # the client's: lower goes first in the engine's queues (service.batching)
    phases: list[Phase] | None = None  # a sampled request's stretches (None: not traced, nothing recorded)
    engine_done_s: float | None = None  # when its last engine work came back (post-processing starts)
    stream_error: str | None = None  # a stream that failed after its 200 was sent: a server failure
    _batches: set[int] = field(default_factory=set, repr=False)

    def serve(self, model: str, task: str, stats: ModelStats) -> None:
        """The request is for `model`'s `task`: its metrics and statistics go there."""
        self.model, self.task, self.stats = model, task, stats

    def add_tokenize(self, seconds: float) -> None:
        self.tokenize_s = (self.tokenize_s or 0.0) + seconds

    def add_item(self, timing: ItemTiming) -> None:
        if timing.queue_s is not None:
            self.queue_s = max(self.queue_s or 0.0, timing.queue_s)
        if timing.run_s is not None and timing.batch not in self._batches:
            if timing.batch is not None:
                self._batches.add(timing.batch)
            self.inference_s = (self.inference_s or 0.0) + timing.run_s

    def add_truncated(self, count: int) -> None:
        self.truncated = (self.truncated or 0) + count


def exchange_of(scope: MutableMapping[str, Any]) -> Exchange:
    """The request's exchange, as the outermost middleware opened it; a fresh one where none did (an app
    mounted without that middleware still serves, with nobody reading what it records)."""
    found = scope.get(SCOPE_KEY)
    if isinstance(found, Exchange):
        return found
    opened = Exchange()
    scope[SCOPE_KEY] = opened
    return opened
