"""Draining for shutdown: once it begins, new work gets 503 while admitted requests run to the end.

The gate is shared by this middleware (which counts admitted requests) and whoever decides when the
process may stop (`service.server` on SIGTERM, the lifespan otherwise). Reads (GET, HEAD, OPTIONS) are
still served: they are cheap and include the probes, and /ready answers 503 from the app's state.
"""

from __future__ import annotations

import asyncio
import time

from starlette.types import ASGIApp, Receive, Scope, Send

from service.api.errors import ShuttingDownError, response_for

READS = frozenset({"GET", "HEAD", "OPTIONS"})


class DrainGate:
    def __init__(self) -> None:
        self.draining = False
        self.in_flight = 0

    def begin(self) -> None:
        """Safe to call from a signal handler: it only sets a flag."""
        self.draining = True

    async def wait_idle(self, timeout_s: float, poll_s: float = 0.05) -> bool:
        """Wait until no admitted request is left, at most `timeout_s`; whether that happened."""
        deadline = time.monotonic() + timeout_s
        while self.in_flight and time.monotonic() < deadline:
            await asyncio.sleep(poll_s)
        return self.in_flight == 0


class DrainMiddleware:
    def __init__(self, app: ASGIApp, gate: DrainGate) -> None:
        self.app = app
        self.gate = gate

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        if self.gate.draining and scope["method"] not in READS:
            response = response_for(
                ShuttingDownError("the server is shutting down; send this elsewhere"), scope["path"]
            )
            assert response is not None
            await response(scope, receive, send)
            return
        self.gate.in_flight += 1
        try:
            await self.app(scope, receive, send)
        finally:
            self.gate.in_flight -= 1
