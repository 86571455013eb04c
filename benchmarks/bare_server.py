"""The ceiling reference: distilserve's engine behind the least a Python HTTP layer can do per request.

    python -m benchmarks.bare_server --model-repository models --port 8101   (the service's flags and env)

uvicorn and a bare ASGI callable for `POST /v1/classify` `{"inputs": "<one text>", "model"?}`: read the body,
json.loads, tokenize, submit to the same micro-batcher and engine the service uses, write the labels.
No framework, no schema validation, no request metrics, no access log, no auth, drain or limits; just
enough /metrics and /v1/models for the benchmark to read batch sizes and engine instances.

The benchmark serves it beside the service: its throughput ÷ the engine's raw throughput is what any
Python server could reach on this engine and machine, so the distance from the service to it is what the
service's HTTP layer costs, and the distance from it to the raw engine is what no Python layer can close.
Not a server to deploy: bad input is a 400 with no more than the exception's text.
"""

from __future__ import annotations

import json
import sys
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import uvicorn

from service.app import LocalEngine
from service.exchange import Exchange
from service.logs import configure_logging
from service.metrics import Metrics
from service.registry import ModelRegistry
from service.runtime import ort_engine_factory
from service.settings import Settings, parse_cli
from service.tasks.classification import classify

Send = Any  # the ASGI callables, untyped as in uvicorn's own signatures
Receive = Any


class BareClassifier:
    """One ASGI callable; the models are loaded by its lifespan, as in the service."""

    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        self.metrics = Metrics()
        self.registry: ModelRegistry | None = None

    async def __call__(self, scope: dict[str, Any], receive: Receive, send: Send) -> None:
        if scope["type"] == "lifespan":
            await self._lifespan(receive, send)
            return
        path = scope["path"]
        if path == "/v1/classify" and scope["method"] == "POST":
            status, body = await self._classify(await _read_body(receive))
        elif path == "/metrics":
            status, body = 200, self.metrics.exposition()
        elif path == "/v1/models" and self.registry is not None:
            status, body = 200, json.dumps({"models": [m.describe() for m in self.registry.all()]}).encode()
        else:
            status, body = 404, b'{"error": "not found"}'
        await send(
            {
                "type": "http.response.start",
                "status": status,
                "headers": [(b"content-type", b"application/json"), (b"content-length", b"%d" % len(body))],
            }
        )
        await send({"type": "http.response.body", "body": body})

    async def _classify(self, raw: bytes) -> tuple[int, bytes]:
        assert self.registry is not None
        try:
            request = json.loads(raw)
            model = self.registry.resolve("text-classification", request.get("model"), None)
            timeout_s = self.settings.request_timeout_s
            labels = await classify(model, [request["inputs"]], 1, self.metrics, timeout_s, Exchange())
        except Exception as e:  # a reference server: the error's text is the whole answer
            return 400, json.dumps({"error": str(e)}).encode()
        return 200, json.dumps(labels[0]).encode()

    async def _lifespan(self, receive: Receive, send: Send) -> None:
        await receive()  # lifespan.startup
        async with self._models():
            await send({"type": "lifespan.startup.complete"})
            await receive()  # lifespan.shutdown
        await send({"type": "lifespan.shutdown.complete"})

    @asynccontextmanager
    async def _models(self) -> AsyncIterator[None]:
        """The engine in this process, as the service's in-process mode runs it (no IPC hop)."""
        engine = LocalEngine(
            self.settings.model_copy(update={"warmup": True}), self.metrics, ort_engine_factory
        )
        self.registry = ModelRegistry(await engine.open())
        try:
            yield
        finally:
            await engine.close()


async def _read_body(receive: Receive) -> bytes:
    chunks = []
    while True:
        message = await receive()
        chunks.append(message.get("body", b""))
        if not message.get("more_body"):
            return b"".join(chunks)


if __name__ == "__main__":
    settings = parse_cli(sys.argv[1:], prog="python -m benchmarks.bare_server")
    configure_logging(settings.log_level, settings.log_format)
    uvicorn.run(
        BareClassifier(settings),
        host=settings.host,
        port=settings.port,
        log_level=settings.log_level,
        access_log=False,
    )
