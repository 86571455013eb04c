"""The task lane: task POSTs skip the framework's layers and answer exactly as the framework's stack does."""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from fastapi.testclient import TestClient
from starlette.types import ASGIApp, Receive, Scope, Send

from service.api.task_lane import ByPath
from service.app import create_app
from service.settings import Settings

FRESH = re.compile(r'"(id|created)":("[^"]*"|\d+),')  # an OpenAI answer's own id and time
CLASSIFY = {"inputs": ["a fine film", "a dull one"], "model": "tiny-cls"}
REQUESTS: list[tuple[str, dict[str, Any]]] = [
    ("/v1/classify", {"json": CLASSIFY}),
    ("/v1/classify", {"json": {**CLASSIFY, "top_k": 2}}),
    ("/v1/qa", {"json": {"question": "who?", "context": "Ann wrote it.", "model": "tiny-qa"}}),
    ("/v1/fill-mask", {"json": {"inputs": "a [MASK] film", "model": "tiny-mlm"}}),
    ("/v1/generate", {"json": {"inputs": "once upon", "max_new_tokens": 4, "model": "tiny-lm"}}),
    ("/v1/generate", {"json": {"inputs": "once", "max_new_tokens": 3, "stream": True, "model": "tiny-lm"}}),
    ("/v1/completions", {"json": {"prompt": "once", "max_tokens": 3, "temperature": 0, "model": "tiny-lm"}}),
    ("/v1/classify", {"content": b'{"inputs": "a"', "headers": {"content-type": "application/json"}}),
    ("/v1/classify", {"content": b"", "headers": {"content-type": "application/json"}}),
    ("/v1/classify", {"content": b"inputs=a", "headers": {"content-type": "text/plain"}}),
    ("/v1/classify", {"json": {"inputs": "a", "model": "no-such-model"}}),
    ("/v1/classify", {"json": {"inputs": "a", "model": "tiny-qa"}}),
    ("/v1/classify", {"json": {"inputs": ""}}),
    ("/v1/completions", {"json": {"prompt": "once", "max_tokens": 0, "model": "tiny-lm"}}),
    ("/v1/completions", {"json": {"prompt": "once", "model": "nobody"}}),
]


@pytest.fixture(scope="module")
def client(tiny_repository: Path) -> Iterator[TestClient]:
    settings = Settings(model_repository=tiny_repository, warmup=False)
    with TestClient(create_app(settings)) as c:
        yield c


def through(stack: ASGIApp, app: Any) -> ASGIApp:
    """`stack` as the app calls it (Starlette puts the app in the scope before its stack)."""

    async def call(scope: Scope, receive: Receive, send: Send) -> None:
        scope["app"] = app
        await stack(scope, receive, send)

    return call


def answer(client: TestClient, stack: ASGIApp, path: str, kwargs: dict[str, Any]) -> tuple[int, str, dict]:
    """POST through `stack` on the client's own event loop, where the app's models run."""

    async def post() -> httpx.Response:
        transport = httpx.ASGITransport(app=through(stack, client.app))
        async with httpx.AsyncClient(transport=transport, base_url="http://test") as c:
            headers = {"X-Request-ID": "same-id", **kwargs.pop("headers", {})}
            return await c.post(path, headers=headers, **kwargs)

    assert client.portal is not None
    r = client.portal.call(post)
    headers = {k: v for k, v in r.headers.items() if k not in ("date", "server", "content-length")}
    return r.status_code, FRESH.sub("", r.text), headers


@pytest.mark.parametrize(("path", "kwargs"), REQUESTS)
def test_the_lane_answers_as_the_framework_does(
    client: TestClient, path: str, kwargs: dict[str, Any]
) -> None:
    stack = client.app.middleware_stack  # type: ignore[attr-defined]
    assert isinstance(stack, ByPath)
    assert path in stack.paths
    lane = answer(client, stack, path, dict(kwargs))
    framework = answer(client, stack.framework, path, dict(kwargs))
    assert lane == framework


def test_other_methods_and_paths_take_the_framework(client: TestClient) -> None:
    r = client.get("/v1/classify")
    assert r.status_code == 405 and r.json()["error_type"] == "http"
    assert client.get("/health").status_code == 200
