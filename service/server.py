"""uvicorn, with a drain before it stops: SIGTERM turns /ready to 503 at once and lets admitted work finish.

Plain uvicorn stops listening the moment SIGTERM arrives, so a load balancer polling /ready sees refused
connections rather than a 503, and a request arriving a millisecond late gets a reset rather than an
answer. Here the first SIGTERM (or Ctrl-C) instead marks the app not ready and draining (new work: 503),
waits for admitted requests to finish within the grace period, and only then hands over to uvicorn's own
graceful shutdown (stop listening, close idle connections, run the lifespan, which drains the batchers)
with what is left of the grace period. A second signal skips the wait.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import os
import resource
import socket
import sys
import time
from collections.abc import Iterator
from types import FrameType
from typing import Any

import uvicorn
from fastapi import FastAPI
from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

from service.api.disconnect import CANCELS, GONE, WORK
from service.api.drain import DrainGate
from service.logs import stop_writing
from service.settings import Settings
from service.turn_writes import TurnWriteTransport

log = logging.getLogger(__name__)
STARTUP_FAILURE = 3  # what uvicorn.run exits with when the app cannot start


class GuardedHttpToolsProtocol(HttpToolsProtocol):
    """uvicorn's HTTP protocol with two guards of its own.

    - A dropped connection cancels its request's registered work at once (service.api.disconnect): a
      client that leaves takes its queued work with it, at no cost per request (a watcher task per
      request cost the event loop ~50-100 us).
    - Slow and idle clients are cut (OWASP API4): a connection must send a request's headers within
      `header_timeout_s` of opening (or of its last answer) and its body within `body_timeout_s` of the
      headers, else it gets a 408 and is closed. uvicorn alone waits for both forever, so a few thousand
      connections trickling their bodies held the server.

    And an answer leaves in one write: uvicorn writes the status line and headers, then the body, each a
    system call; what one turn of the loop writes is sent together at its end (service.turn_writes).
    """

    header_timeout_s = 10.0  # set per server by `guarded_protocol`
    body_timeout_s = 30.0
    _guard: asyncio.TimerHandle | None = None

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(TurnWriteTransport(transport, self.loop))  # type: ignore[arg-type]
        self._arm(self.header_timeout_s)  # connections that send nothing are cut too

    def on_message_begin(self) -> None:
        super().on_message_begin()
        self._arm(self.header_timeout_s)

    def on_headers_complete(self) -> None:
        super().on_headers_complete()
        if self.cycle is not None:
            self.cycle.scope[CANCELS] = True  # type: ignore[literal-required]
        self._arm(self.body_timeout_s)

    def on_message_complete(self) -> None:
        super().on_message_complete()
        self._disarm()

    def on_response_complete(self) -> None:
        super().on_response_complete()
        if self.pipeline:  # a queued request starts now: its bytes are all in
            self._disarm()

    def connection_lost(self, exc: Exception | None) -> None:
        self._disarm()
        cycle = self.cycle
        super().connection_lost(exc)
        if cycle is None or not cycle.disconnected:
            return
        scope: dict[str, Any] = cycle.scope  # type: ignore[assignment]
        work = scope.get(WORK)
        if work is not None and not work.done():
            scope[GONE] = True
            work.cancel()

    def _arm(self, seconds: float) -> None:
        self._disarm()
        self._guard = self.loop.call_later(seconds, self._too_slow)

    def _disarm(self) -> None:
        if self._guard is not None:
            self._guard.cancel()
            self._guard = None

    def _too_slow(self) -> None:
        self._guard = None
        if self.transport.is_closing():
            return
        if self.cycle is None or not self.cycle.response_started:
            self.transport.write(REQUEST_TIMEOUT)
        self.transport.close()


_TIMEOUT_BODY = b'{"error": "the request did not arrive in time", "error_type": "request_timeout"}'
REQUEST_TIMEOUT = (
    b"HTTP/1.1 408 Request Timeout\r\ncontent-type: application/json\r\nconnection: close\r\n"
    b"content-length: %d\r\n\r\n%s" % (len(_TIMEOUT_BODY), _TIMEOUT_BODY)
)


def connection_cap(settings: Settings) -> int:
    """`max_connections`, or 80 % of the open-file limit: refuse before accept() fails with EMFILE.
    (A fixed cap of 1000 turned 20 % of normal requests into 503s while 3,000 slow clients were open.)"""
    if settings.max_connections:
        return settings.max_connections
    soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
    return max(64, int(0.8 * soft)) if soft != resource.RLIM_INFINITY else 65536


def guarded_protocol(settings: Settings) -> type[GuardedHttpToolsProtocol]:
    """The protocol class with this server's timeouts."""
    return type(
        "GuardedHttpToolsProtocol",
        (GuardedHttpToolsProtocol,),
        {"header_timeout_s": settings.header_timeout_s, "body_timeout_s": settings.body_timeout_s},
    )


class DrainingServer(uvicorn.Server):
    def __init__(self, config: uvicorn.Config, app: FastAPI, grace_s: float) -> None:
        super().__init__(config)
        self._app = app
        self._gate: DrainGate = app.state.drain
        self.grace_s = grace_s
        self._loop: asyncio.AbstractEventLoop | None = None
        self._drain_task: asyncio.Task[None] | None = None
        self._draining = False

    async def serve(self, sockets: list[socket.socket] | None = None) -> None:
        self._loop = asyncio.get_running_loop()
        await super().serve(sockets)

    @contextlib.contextmanager
    def capture_signals(self) -> Iterator[None]:
        """uvicorn's, which raises a caught SIGTERM again once served (the process then dies of it): the
        queued log lines (service.logs) are written before that."""
        with super().capture_signals():
            try:
                yield
            finally:
                stop_writing()

    def handle_exit(self, sig: int, frame: FrameType | None) -> None:
        """Runs in the signal handler: set flags, then let the loop do the rest."""
        if not self.started:
            # Not listening, nothing admitted: stop now. Start-up may be waiting for an engine core that
            # never comes, and uvicorn would wait for the start-up to end before it looks at the signal.
            log.info("stopped while starting: nothing was admitted")
            stop_writing()  # os._exit runs no atexit: the queued log lines first
            os._exit(0)
        if self._draining or not self.started or self._loop is None:
            super().handle_exit(sig, frame)  # during start-up, or a second signal: uvicorn's own way
            return
        self._draining = True
        self._app.state.ready = False
        self._gate.begin()
        self._loop.call_soon_threadsafe(self._start_drain, sig)

    def _start_drain(self, sig: int) -> None:
        self._drain_task = asyncio.ensure_future(self._drain_then_exit(sig))

    async def _drain_then_exit(self, sig: int) -> None:
        started = time.monotonic()
        log.info("draining for shutdown: %d request(s) in flight", self._gate.in_flight)
        if await self._gate.wait_idle(self.grace_s):
            log.info("drained in %.2f s", time.monotonic() - started)
        else:
            log.warning("grace period over with %d request(s) still in flight", self._gate.in_flight)
        left = self.grace_s - (time.monotonic() - started)
        self.config.timeout_graceful_shutdown = max(0, math.ceil(left))
        super().handle_exit(sig, None)


def serve(app: FastAPI, settings: Settings, sockets: list[socket.socket] | None = None) -> None:
    """Run `app` until a signal, then drain and stop; exits like uvicorn.run when start-up fails.

    `sockets`: listen on these (a worker, on its supervisor's socket) instead of binding host and port.
    """
    config = uvicorn.Config(
        app,
        host=settings.host,
        port=settings.port,
        log_level=settings.log_level,
        log_config=None,  # uvicorn's lines go through service.logs (written by a thread, never blocking)
        access_log=False,  # the app writes its own access lines (service.api.access)
        http=guarded_protocol(settings),
        limit_concurrency=connection_cap(settings),  # beyond: 503, requests in flight go on
        timeout_graceful_shutdown=math.ceil(settings.shutdown_grace_s),
    )
    server = DrainingServer(config, app, settings.shutdown_grace_s)
    server.run(sockets)
    if not server.started:
        sys.exit(STARTUP_FAILURE)
