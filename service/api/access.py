"""The outermost layer (pure ASGI): a request id on every response, one access-log line per request, and
the request metrics and model statistics.

It opens the request's exchange (service.exchange: id and text limits) for everything below, reads back
which model it was for, what it cost and whether inputs were truncated, and records it whatever happened
inside, a crash included. One layer for all of it: each ASGI layer wraps `send` once more per request.

Request metrics count every request for work by model, task and status and time it end to end; reads (GET,
HEAD, OPTIONS: probes, metadata, /metrics, /docs, and v2's repository index, a POST that only reads) are not
counted: they would show as requests refused before a model was chosen, the one thing an empty model label
means. A stream that fails after its first event (its 200 already sent) counts as 500.
"""

from __future__ import annotations

import itertools
import logging
import os
import re
import time
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

from starlette.datastructures import Headers, MutableHeaders
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from service.api.drain import READS
from service.api.errors import error_response
from service.exchange import SCOPE_KEY, Exchange, Phase, TextLimits
from service.logs import ACCESS_LOGGER
from service.metrics import Metrics
from service.tracing import Tracing, trace_id_of

if TYPE_CHECKING:
    from opentelemetry.trace import Span

REQUEST_ID_HEADER = "X-Request-ID"
TRUNCATED_HEADER = "X-Distilserve-Truncated"
ANSWERED_BY_HEADER = "X-Distilserve-Answered-By"  # a cascade's student, its teacher, or both
TEACHER_BUSY_HEADER = "X-Distilserve-Teacher-Busy"  # unsure inputs the student answered: teacher busy
SANE_REQUEST_ID = re.compile(r"[A-Za-z0-9._-]{1,128}")
POSTED_READS = frozenset({"/v2/repository/index"})

access_log = logging.getLogger(ACCESS_LOGGER)


class RequestIds:
    """Fresh ids shaped like a uuid4's hex (32 characters): a random prefix per process and a counter.

    A uuid4 reads the kernel's random source for every request (~2 % of the event loop at 64 clients);
    these only need to be unique, not unguessable. A forked child draws a prefix of its own."""

    def __init__(self) -> None:
        self._reset()
        os.register_at_fork(after_in_child=self._reset)

    def _reset(self) -> None:
        self._prefix = os.urandom(10).hex()
        self._counter = itertools.count()

    def next(self) -> str:
        return f"{self._prefix}{next(self._counter) & 0xFFFF_FFFF_FFFF:012x}"


_fresh_ids = RequestIds()


def request_id_from(headers: Headers) -> str:
    """The client's id when it is safe to echo and to log, else a fresh one."""
    given = headers.get("x-request-id", "")
    return given if SANE_REQUEST_ID.fullmatch(given) else _fresh_ids.next()


def _ms(seconds: float | None) -> float | None:
    return None if seconds is None else round(seconds * 1000.0, 3)


def access_fields(
    scope: Scope, x: Exchange, status: int | None, arrived: datetime, duration_s: float
) -> dict[str, Any]:
    client = scope.get("client")
    fields: dict[str, Any] = {
        "time": arrived.isoformat(timespec="milliseconds"),
        "request_id": x.request_id,
        "method": scope["method"],
        "path": scope["path"],
        "status": status,  # None: the client left (or the server gave up) before any response
        "model": x.model or None,
        "task": x.task or None,
        "duration_ms": _ms(duration_s),
        "tokenize_ms": _ms(x.tokenize_s),
        "queue_ms": _ms(x.queue_s),
        "inference_ms": _ms(x.inference_s),
        "truncated": x.truncated,
        "client": f"{client[0]}:{client[1]}" if client else None,
    }
    if x.stream_error is not None:  # the status was sent before the stream failed
        fields["error"] = x.stream_error
    return fields


class ExchangeMiddleware:
    def __init__(
        self, app: ASGIApp, limits: TextLimits, metrics: Metrics, tracing: Tracing | None = None
    ) -> None:
        self.app = app
        self.limits = limits
        self.metrics = metrics
        self.tracing = tracing

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        x = Exchange(request_id=request_id_from(Headers(scope=scope)), limits=self.limits)
        scope[SCOPE_KEY] = x
        counted = scope["method"] not in READS and scope["path"] not in POSTED_READS
        arrived = datetime.now(UTC)
        started = time.perf_counter()
        status: int | None = None
        span = None
        if self.tracing is not None:
            carrier = {k.decode("latin-1"): v.decode("latin-1") for k, v in scope["headers"]}
            span = self.tracing.start(f"{scope['method']} {scope['path']}", carrier, started)
            if span.is_recording():  # sampled: its phases are recorded (and its engine calls traced)
                x.phases = []
        answered: float | None = None

        async def send_with_headers(message: Message) -> None:
            nonlocal status, answered
            if message["type"] == "http.response.start":
                status = message["status"]
                answered = time.perf_counter()
                headers = MutableHeaders(scope=message)
                headers[REQUEST_ID_HEADER] = x.request_id
                if x.truncated is not None:
                    headers[TRUNCATED_HEADER] = str(x.truncated)
                if x.answered_by:
                    headers[ANSWERED_BY_HEADER] = ", ".join(x.answered_by)
                if x.teacher_busy:
                    headers[TEACHER_BUSY_HEADER] = str(x.teacher_busy)
            await send(message)

        if counted:
            self.metrics.in_flight.inc()
        try:
            await self.app(scope, receive, send_with_headers)
        except Exception:
            if status is None:  # answer with the id, then let the server log the traceback
                response = error_response(
                    500, "internal", f"internal error (request {x.request_id})", path=scope["path"]
                )
                await response(scope, receive, send_with_headers)
            raise
        finally:
            elapsed = time.perf_counter() - started
            if counted:
                self.metrics.in_flight.dec()
                self._record(x, status, elapsed)
            trace_id = None
            if span is not None and self.tracing is not None:
                trace_id = self._trace(span, scope, x, status, started + elapsed, answered)
            if access_log.isEnabledFor(logging.INFO):  # the fields cost more than the check
                fields = access_fields(scope, x, status, arrived, elapsed)
                if trace_id is not None:
                    fields["trace_id"] = trace_id
                line = (fields["method"], fields["path"], status)
                access_log.info("%s %s %s", *line, extra={"access": fields})

    def _trace(
        self, span: Span, scope: Scope, x: Exchange, status: int | None, ended: float, answered: float | None
    ) -> str:
        """The request's spans (service.tracing); its trace id."""
        assert self.tracing is not None
        attributes = {
            "http.request.method": scope["method"],
            "url.path": scope["path"],
            "http.response.status_code": status,
            **exchange_attributes(x),
        }
        self.tracing.finish(span, request_phases(x, answered), attributes, ended)
        return trace_id_of(span)

    def _record(self, x: Exchange, status: int | None, elapsed: float) -> None:
        record_request(self.metrics, x, status, elapsed)


def exchange_attributes(x: Exchange) -> dict[str, str | None]:
    """What a request's server span says of it, whichever protocol carried it."""
    return {
        "distilserve.request_id": x.request_id,
        "distilserve.model": x.model or None,
        "distilserve.task": x.task or None,
        "distilserve.answered_by": ", ".join(x.answered_by) or None,
    }


def request_phases(x: Exchange, answered: float | None) -> list[Phase]:
    """A sampled request's phases as its exchange recorded them, and its post-processing (from its last
    engine answer to its own); none for a request that was not sampled."""
    if x.phases is None:
        return []
    phases = list(x.phases)
    if x.engine_done_s is not None and answered is not None and answered >= x.engine_done_s:
        phases.append(Phase("postprocess", x.engine_done_s, answered, {"model": x.model}))
    return phases


def record_request(metrics: Metrics, x: Exchange, status: int | None, elapsed: float) -> None:
    """A request's series, and its model's statistics (HTTP here, gRPC in service.api.grpc_v2). A client
    gone before any answer is a 500 as before (nothing was sent); a stream that failed after its 200 is a
    server failure."""
    code = 500 if status is None or x.stream_error is not None else status
    count, duration = metrics.request_series(x.model, x.task, code)
    count.inc()
    duration.observe(elapsed)
    if x.stats is not None:
        x.stats.observe_request(code < 400, elapsed, x)
