"""The outermost layer (pure ASGI): a request id on every response, and one access-log line per request.

It binds the request's context (id and text limits) for everything below, reads back what the request
cost and whether inputs were truncated, and writes the line whatever happened inside, a crash included.
"""

from __future__ import annotations

import itertools
import logging
import os
import re
import time
from datetime import UTC, datetime
from typing import Any

from starlette.datastructures import Headers, MutableHeaders
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from service.api.errors import error_response
from service.logs import ACCESS_LOGGER
from service.request_context import RequestContext, TextLimits, bind

REQUEST_ID_HEADER = "X-Request-ID"
TRUNCATED_HEADER = "X-Distilserve-Truncated"
SANE_REQUEST_ID = re.compile(r"[A-Za-z0-9._-]{1,128}")

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
    scope: Scope, context: RequestContext, status: int | None, arrived: datetime, duration_s: float
) -> dict[str, Any]:
    state = scope.get("state", {})
    client = scope.get("client")
    fields: dict[str, Any] = {
        "time": arrived.isoformat(timespec="milliseconds"),
        "request_id": context.request_id,
        "method": scope["method"],
        "path": scope["path"],
        "status": status,  # None: the client left (or the server gave up) before any response
        "model": state.get("model") or None,
        "task": state.get("task") or None,
        "duration_ms": _ms(duration_s),
        "tokenize_ms": _ms(context.tokenize_s),
        "queue_ms": _ms(context.queue_s),
        "inference_ms": _ms(context.inference_s),
        "truncated": context.truncated,
        "client": f"{client[0]}:{client[1]}" if client else None,
    }
    if "stream_error" in state:  # the status was sent before the stream failed
        fields["error"] = state["stream_error"]
    return fields


class AccessMiddleware:
    def __init__(self, app: ASGIApp, limits: TextLimits) -> None:
        self.app = app
        self.limits = limits

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        context = RequestContext(request_id=request_id_from(Headers(scope=scope)), limits=self.limits)
        scope.setdefault("state", {})["request_id"] = context.request_id
        arrived = datetime.now(UTC)
        started = time.perf_counter()
        status: int | None = None

        async def send_with_headers(message: Message) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = message["status"]
                headers = MutableHeaders(scope=message)
                headers[REQUEST_ID_HEADER] = context.request_id
                if context.truncated is not None:
                    headers[TRUNCATED_HEADER] = str(context.truncated)
            await send(message)

        try:
            with bind(context):
                await self.app(scope, receive, send_with_headers)
        except Exception:
            if status is None:  # answer with the id, then let the server log the traceback
                response = error_response(
                    500, "internal", f"internal error (request {context.request_id})", path=scope["path"]
                )
                await response(scope, receive, send_with_headers)
            raise
        finally:
            if access_log.isEnabledFor(logging.INFO):  # the fields cost more than the check
                fields = access_fields(scope, context, status, arrived, time.perf_counter() - started)
                line = (fields["method"], fields["path"], status)
                access_log.info("%s %s %s", *line, extra={"access": fields})
