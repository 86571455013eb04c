"""Writes made in one turn of the event loop leave in one system call: an HTTP answer, an IPC batch."""

from __future__ import annotations

import asyncio
from typing import Any

import uvicorn
from starlette.types import Receive, Scope, Send
from uvicorn.server import ServerState

from service.server import guarded_protocol
from service.settings import Settings
from service.turn_writes import TurnWriteTransport


class RecordingTransport:
    """A socket's transport that records each write (each would be a system call)."""

    def __init__(self) -> None:
        self.writes: list[bytes] = []
        self.closed = self.aborted = False

    def write(self, data: bytes) -> None:
        self.writes.append(bytes(data))

    def writelines(self, chunks: Any) -> None:
        self.writes.append(b"".join(chunks))

    def is_closing(self) -> bool:
        return self.closed or self.aborted

    def close(self) -> None:
        self.closed = True

    def abort(self) -> None:
        self.aborted = True

    def get_extra_info(self, name: str, default: Any = None) -> Any:
        return {"sockname": ("127.0.0.1", 8000), "peername": ("127.0.0.1", 50000)}.get(name, default)

    def pause_reading(self) -> None: ...

    def resume_reading(self) -> None: ...


def test_one_turns_writes_leave_together_and_close_sends_them_first() -> None:
    async def main() -> RecordingTransport:
        raw = RecordingTransport()
        writer = TurnWriteTransport(raw, asyncio.get_running_loop())  # type: ignore[arg-type]
        writer.write(b"head ")
        writer.writelines([b"body ", b"more"])
        assert raw.writes == []  # nothing until the turn ends
        await asyncio.sleep(0)
        assert raw.writes == [b"head body more"]
        writer.write(b"last")
        writer.close()
        assert raw.writes[-1] == b"last" and raw.closed
        return raw

    asyncio.run(main())


def test_an_aborted_connection_sends_nothing_more() -> None:
    async def main() -> None:
        raw = RecordingTransport()
        writer = TurnWriteTransport(raw, asyncio.get_running_loop())  # type: ignore[arg-type]
        writer.write(b"never")
        writer.abort()
        await asyncio.sleep(0)
        assert raw.writes == [] and raw.aborted

    asyncio.run(main())


def test_an_http_answer_is_one_write() -> None:
    """uvicorn writes the status line and headers, then the body: here they leave together."""

    async def app(scope: Scope, receive: Receive, send: Send) -> None:
        await receive()
        await send({"type": "http.response.start", "status": 200, "headers": [(b"content-length", b"2")]})
        await send({"type": "http.response.body", "body": b"ok"})

    async def main() -> RecordingTransport:
        config = uvicorn.Config(app, http=guarded_protocol(Settings()), lifespan="off", log_level="warning")
        config.load()
        protocol = config.http_protocol_class(config=config, server_state=ServerState(), app_state={})
        raw = RecordingTransport()
        protocol.connection_made(raw)  # type: ignore[arg-type]
        protocol.data_received(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n")
        for _ in range(20):  # the request's task runs, then the turn's writes leave
            await asyncio.sleep(0)
        protocol.connection_lost(None)
        return raw

    raw = asyncio.run(main())
    assert len(raw.writes) == 1, raw.writes
    assert raw.writes[0].startswith(b"HTTP/1.1 200 OK\r\n") and raw.writes[0].endswith(b"\r\n\r\nok")
