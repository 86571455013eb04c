"""Every response carries X-Request-ID; every request leaves one structured access-log line."""

from __future__ import annotations

import asyncio
import json
import logging
import os
import re
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from fastapi.testclient import TestClient
from starlette.types import Receive, Scope, Send

from service.api.access import ExchangeMiddleware, RequestIds
from service.app import create_app
from service.exchange import TextLimits
from service.logs import ACCESS_LOGGER, JsonAccessFormatter, TextAccessFormatter
from service.metrics import Metrics
from service.settings import Settings

HEX_ID = re.compile(r"[0-9a-f]{32}")


@pytest.fixture(scope="module")
def client(tiny_repository: Path) -> Iterator[TestClient]:
    settings = Settings(model_repository=tiny_repository, warmup=False, max_body_bytes=2048)
    with TestClient(create_app(settings)) as c:
        yield c


def test_an_id_is_generated_when_none_is_sent(client: TestClient) -> None:
    first = client.post("/v1/classify", json={"inputs": "a fine film"})
    second = client.get("/health")
    assert first.status_code == 200
    assert HEX_ID.fullmatch(first.headers["X-Request-ID"])
    assert HEX_ID.fullmatch(second.headers["X-Request-ID"])
    assert first.headers["X-Request-ID"] != second.headers["X-Request-ID"]


def test_fresh_ids_are_unique_and_a_forked_child_draws_its_own() -> None:
    ids = RequestIds()
    drawn = [ids.next() for _ in range(10_000)]
    assert len(set(drawn)) == len(drawn) and all(HEX_ID.fullmatch(i) for i in drawn)
    read, write = os.pipe()
    child = os.fork()
    if child == 0:  # the child: one id back to the parent, then out without running anything else
        os.write(write, ids.next().encode())
        os._exit(0)
    os.close(write)
    from_child = os.read(read, 64).decode()
    os.close(read)
    os.waitpid(child, 0)
    assert HEX_ID.fullmatch(from_child) and from_child[:20] != drawn[0][:20]  # another process prefix


@pytest.mark.parametrize("given", ["abc-123", "trace.id_42", "A" * 128])
def test_a_sane_id_is_echoed(client: TestClient, given: str) -> None:
    r = client.post("/v1/classify", json={"inputs": "a fine film"}, headers={"X-Request-ID": given})
    assert r.headers["X-Request-ID"] == given


@pytest.mark.parametrize("given", ["has space", "A" * 129, "semi;colon", "ünï".encode(), "x\\y", ""])
def test_an_unsafe_id_is_replaced(client: TestClient, given: str | bytes) -> None:
    r = client.get("/health", headers={"X-Request-ID": given})
    assert HEX_ID.fullmatch(r.headers["X-Request-ID"])


@pytest.mark.parametrize(
    ("kwargs", "status"),
    [
        (dict(json={"inputs": "ok", "model": "nope"}), 404),
        (dict(json={"inputs": ""}), 422),
        (dict(content=b'{"inputs": "ok"}', headers={"content-type": "text/plain"}), 415),
        (dict(content=b"x" * 4096, headers={"content-type": "application/json"}), 413),
    ],
)
def test_errors_carry_the_id_too(client: TestClient, kwargs: dict, status: int) -> None:
    headers = {"X-Request-ID": "err-1", **kwargs.pop("headers", {})}
    r = client.post("/v1/classify", headers=headers, **kwargs)
    assert r.status_code == status
    assert r.headers["X-Request-ID"] == "err-1"


def test_a_crash_still_answers_with_the_id_and_is_logged(caplog: pytest.LogCaptureFixture) -> None:
    async def crashing(scope: Scope, receive: Receive, send: Send) -> None:
        raise RuntimeError("boom")

    async def call() -> httpx.Response:
        app = ExchangeMiddleware(crashing, TextLimits(), Metrics())
        transport = httpx.ASGITransport(app=app, raise_app_exceptions=False)
        async with httpx.AsyncClient(transport=transport, base_url="http://test") as c:
            return await c.get("/v1/models", headers={"X-Request-ID": "crash-1"})

    with caplog.at_level(logging.INFO, logger=ACCESS_LOGGER):
        r = asyncio.run(call())
    assert r.status_code == 500 and r.headers["X-Request-ID"] == "crash-1"
    assert r.json() == {"error": "internal error (request crash-1)", "error_type": "internal"}
    [record] = [rec for rec in caplog.records if rec.name == ACCESS_LOGGER]
    assert record.access["status"] == 500  # type: ignore[attr-defined]


def test_the_access_line_is_json_with_the_request_fields(
    client: TestClient, caplog: pytest.LogCaptureFixture
) -> None:
    with caplog.at_level(logging.INFO, logger=ACCESS_LOGGER):
        r = client.post(
            "/v1/classify", json={"inputs": ["a fine film", "a dull one"]}, headers={"X-Request-ID": "log-1"}
        )
    assert r.status_code == 200
    [record] = [rec for rec in caplog.records if rec.name == ACCESS_LOGGER]
    line = JsonAccessFormatter().format(record)
    assert "\n" not in line
    fields = json.loads(line)
    assert fields["request_id"] == "log-1"
    assert (fields["method"], fields["path"], fields["status"]) == ("POST", "/v1/classify", 200)
    assert (fields["model"], fields["task"]) == ("tiny-cls", "text-classification")
    assert re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}\+00:00", fields["time"])
    for key in ("duration_ms", "tokenize_ms", "queue_ms", "inference_ms"):
        assert isinstance(fields[key], float) and fields[key] >= 0, key
    assert fields["inference_ms"] <= fields["duration_ms"]
    assert fields["truncated"] == 0
    assert fields["client"].startswith("testclient")
    text = TextAccessFormatter().format(record)
    assert '"POST /v1/classify" 200' in text and "request_id=log-1" in text


def test_a_request_that_never_reached_a_model_logs_nulls(
    client: TestClient, caplog: pytest.LogCaptureFixture
) -> None:
    with caplog.at_level(logging.INFO, logger=ACCESS_LOGGER):
        client.get("/health")
    [record] = [rec for rec in caplog.records if rec.name == ACCESS_LOGGER]
    fields = json.loads(JsonAccessFormatter().format(record))
    assert fields["status"] == 200 and fields["path"] == "/health"
    assert fields["model"] is None and fields["queue_ms"] is None and fields["inference_ms"] is None
