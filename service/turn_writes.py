"""A transport whose writes during one turn of the event loop leave together, in one system call, at its end.

A write is a system call, and on a loopback or a Unix socket the sender's call also runs much of the
receiver's side. uvicorn writes a response's status line and headers, then its body: two calls per answer,
and the first was the largest single cost of a frontend under load (19 % of its samples on classify). The
IPC channel has the same shape: a frontend sends several requests per turn, the core answers a whole batch
at once. Here the turn's bytes are joined and written once, when the loop has run everything else ready in
this turn (`call_soon`): microseconds later, never a timer.

Transports are not thread-safe, so this is only written to from the loop's own thread, as any transport.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterable
from typing import Any


class TurnWriteTransport:
    """`transport` with `write`/`writelines` deferred to the end of the turn; everything else passes on.

    `close` sends what this turn wrote before closing; `abort` drops it with the connection, as the
    transport's own `abort` drops its buffer."""

    def __init__(self, transport: asyncio.Transport, loop: asyncio.AbstractEventLoop) -> None:
        self._transport = transport
        self._loop = loop
        self._pending: list[bytes | bytearray | memoryview] = []

    def write(self, data: bytes | bytearray | memoryview) -> None:
        if not self._pending:
            self._loop.call_soon(self.flush)
        self._pending.append(data)

    def writelines(self, chunks: Iterable[bytes | bytearray | memoryview]) -> None:
        if not self._pending:
            self._loop.call_soon(self.flush)
        self._pending.extend(chunks)

    def flush(self) -> None:
        """Write what this turn queued now (a no-op when nothing is queued)."""
        if not self._pending:
            return
        pending, self._pending = self._pending, []
        if not self._transport.is_closing():
            self._transport.writelines(pending)

    def is_closing(self) -> bool:  # asked on every send: a method, not a trip through __getattr__
        return self._transport.is_closing()

    def close(self) -> None:
        self.flush()
        self._transport.close()

    def abort(self) -> None:
        self._pending = []
        self._transport.abort()

    def __getattr__(self, name: str) -> Any:  # is_closing, pause_reading, get_extra_info, ...
        return getattr(self._transport, name)
