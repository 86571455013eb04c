"""What one request carries through the layers without widening every signature.

The HTTP layer binds a context per request (its id and the server's text limits); processors add what the
request cost (tokenize, queue and inference time) and how many of its inputs were truncated, and the HTTP
layer reads that back for the access log and the response headers. Outside a request (unit tests, scripts)
`current()` hands out a throwaway context with the default limits, so processors never need an app.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass, field
from typing import Literal

from service.batching import ItemTiming

Truncation = Literal["truncate", "reject"]


@dataclass(frozen=True)
class TextLimits:
    """The server's rules for one text: its raw length, and what to do past the model's window."""

    max_chars: int = 100_000
    truncation: Truncation = "truncate"


@dataclass
class RequestContext:
    request_id: str = ""
    limits: TextLimits = field(default_factory=TextLimits)
    tokenize_s: float | None = None
    queue_s: float | None = None  # the longest wait of the request's items: they queue side by side
    inference_s: float | None = None  # the engine calls the request took part in, each counted once
    truncated: int | None = None  # None: nothing was checked against a window (no header)
    items: int = 1  # the request's batch (texts, pairs or prompts), once the route has checked its size
    _batches: set[int] = field(default_factory=set, repr=False)

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


_current: ContextVar[RequestContext | None] = ContextVar("distilserve_request", default=None)


def current() -> RequestContext:
    """The bound request's context, else a fresh one nobody reads."""
    context = _current.get()
    return context if context is not None else RequestContext()


@contextmanager
def bind(context: RequestContext) -> Iterator[RequestContext]:
    """Make `context` current for this task and the tasks it starts (asyncio copies the context)."""
    token = _current.set(context)
    try:
        yield context
    finally:
        _current.reset(token)
