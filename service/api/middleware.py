"""Counts every request for work by model, task and status, and times it end to end (pure ASGI); a
request for a model also goes into that model's statistics (`service.stats`, Triton's /v2/.../stats).

Reads (GET, HEAD, OPTIONS: probes, metadata, /metrics, /docs, and v2's repository index, a POST that only
reads) are not counted: they would show as requests refused before a model was chosen, the one thing an
empty model label means. A stream that fails after its first event (its 200 already sent) counts as 500.
"""

from __future__ import annotations

import time

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from service.api.drain import READS
from service.metrics import Metrics
from service.request_context import current
from service.stats import ModelStats

POSTED_READS = frozenset({"/v2/repository/index"})


class RequestMetricsMiddleware:
    def __init__(self, app: ASGIApp, metrics: Metrics) -> None:
        self.app = app
        self.metrics = metrics

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope["method"] in READS or scope["path"] in POSTED_READS:
            await self.app(scope, receive, send)
            return
        started = time.perf_counter()
        status = 500

        async def send_and_record(message: Message) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = message["status"]
            await send(message)

        self.metrics.in_flight.inc()
        try:
            await self.app(scope, receive, send_and_record)
        finally:
            self.metrics.in_flight.dec()
            elapsed = time.perf_counter() - started
            state = scope.get("state", {})
            if "stream_error" in state:  # a 200 whose stream failed after it started: a server failure
                status = 500
            model, task = state.get("model", ""), state.get("task", "")
            count, duration = self.metrics.request_series(model, task, status)
            count.inc()
            duration.observe(elapsed)
            stats: ModelStats | None = state.get("stats")
            if stats is not None:
                stats.observe_request(status < 400, elapsed, current())
