"""Streamed generation under load: streams back to back on raw sockets, tokens counted as bytes arrive."""

from __future__ import annotations

import asyncio
import functools
import json
import os
import random
import statistics
import time
from dataclasses import dataclass, field
from typing import Any, cast

import httpx

from loadtests.texts import reviews

TOKEN_MARK, FINISH_MARK = b'"token":', b'"finish_reason":'


class _StreamCounter(asyncio.Protocol):
    """One streamed request, counted as its bytes arrive: no parsing, no buffering. A StreamReader client
    reading every event took 9 % of this 2-core machine at 5,000-6,500 tokens/s; this one takes 5-6 %."""

    def __init__(self, request: bytes, done: asyncio.Future[None]) -> None:
        self.request, self.done = request, done
        self.started = time.perf_counter()
        self.first: float | None = None
        self.tokens = 0
        self.status_ok: bool | None = None
        self.finished = False
        self.carry = b""  # the end of the last read: a mark may straddle two reads

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        cast(asyncio.WriteTransport, transport).write(self.request)  # uvloop's is not a registered subclass

    def data_received(self, data: bytes) -> None:
        if self.status_ok is None:
            self.status_ok = data.startswith(b"HTTP/1.1 200")
        chunk = self.carry + data
        found = chunk.count(TOKEN_MARK)
        if found and self.first is None:
            self.first = time.perf_counter()
        self.tokens += found
        self.finished = self.finished or FINISH_MARK in chunk
        self.carry = chunk[-(len(FINISH_MARK) - 1) :]

    def connection_lost(self, exc: Exception | None) -> None:
        if not self.done.done():
            self.done.set_result(None)


async def _stream_client(
    base: str, model: str, until: float, prompts: list[str], out: list[dict], new_tokens: int
) -> None:
    """Streams requests back to back on raw sockets, so that the client measures the server, not itself."""
    host, port = base.removeprefix("http://").split(":")
    rng = random.Random(len(out))
    loop = asyncio.get_running_loop()
    while time.perf_counter() < until:
        body = json.dumps(
            {
                "model": model,
                "prompt": rng.choice(prompts),
                "max_new_tokens": new_tokens,
                "ignore_eos": True,
                "stream": True,
            }
        )
        request = (
            f"POST /v1/generate HTTP/1.1\r\nHost: {host}\r\nContent-Type: application/json\r\n"
            f"Content-Length: {len(body)}\r\nConnection: close\r\n\r\n{body}"
        ).encode()
        done: asyncio.Future[None] = loop.create_future()
        transport, stream = await loop.create_connection(
            functools.partial(_StreamCounter, request, done), host, int(port)
        )
        await done
        transport.close()
        out.append(
            {
                "ttft": (stream.first or time.perf_counter()) - stream.started,
                "tokens": stream.tokens,
                "ok": bool(stream.status_ok) and stream.finished,
                "ended": time.perf_counter(),
            }
        )


def generation_load(
    base: str,
    model: str,
    streams: int,
    seconds: float,
    new_tokens: int = 64,
    prompts: list[str] | None = None,
) -> dict[str, float]:
    prompts = prompts or reviews(200, seed=3, max_clauses=2)
    records: list[dict] = []

    async def main() -> None:
        until = time.perf_counter() + seconds
        await asyncio.gather(
            *(_stream_client(base, model, until, prompts, records, new_tokens) for _ in range(streams))
        )

    started, cpu = time.perf_counter(), time.process_time()
    try:
        import uvloop  # uvicorn[standard]'s loop: a lighter client

        uvloop.run(main())
    except ImportError:
        asyncio.run(main())
    wall, cpu = time.perf_counter() - started, time.process_time() - cpu
    ttfts = sorted(r["ttft"] * 1000 for r in records)
    return {
        "streams": streams,
        "tokens": sum(r["tokens"] for r in records),
        "tokens_per_s": sum(r["tokens"] for r in records) / wall,
        "ttft_p50_ms": statistics.median(ttfts),
        "ttft_p99_ms": ttfts[min(len(ttfts) - 1, int(0.99 * len(ttfts)))],
        "requests": len(records),
        "errors": sum(not r["ok"] for r in records),
        "client_cpu": cpu / wall / (os.cpu_count() or 1),
    }


@dataclass
class StreamedChat:
    """One streamed /v1/chat/completions answer as a client sees it."""

    text: str = ""
    ttft_s: float = 0.0  # to the first content
    seconds: float = 0.0  # to the last event
    finish_reason: str | None = None
    usage: dict[str, Any] = field(default_factory=dict)  # the last usage the server sent (stream_options)


async def stream_chat(client: httpx.AsyncClient, body: dict[str, Any]) -> StreamedChat:
    """POST `body` (with `"stream": true`) to /v1/chat/completions and read its events to the end."""
    started, first = time.perf_counter(), None
    answer = StreamedChat()
    pieces: list[str] = []
    async with client.stream("POST", "/v1/chat/completions", json=body) as reply:
        reply.raise_for_status()
        async for line in reply.aiter_lines():
            if not line.startswith("data: {"):
                continue
            event = json.loads(line.removeprefix("data: "))
            for choice in event.get("choices", []):
                piece = choice.get("delta", {}).get("content")
                if piece:
                    first = first or time.perf_counter()
                    pieces.append(piece)
                answer.finish_reason = choice.get("finish_reason") or answer.finish_reason
            answer.usage = event.get("usage") or answer.usage
    done = time.perf_counter()
    answer.text, answer.ttft_s, answer.seconds = "".join(pieces), (first or done) - started, done - started
    return answer
