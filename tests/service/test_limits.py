"""Request limits: body size (413 before parsing), characters per text, and the model's window."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path

import pytest
from fastapi.testclient import TestClient
from starlette.types import Message, Receive, Scope, Send

from service.api.limits import BodyLimitMiddleware
from service.app import create_app
from service.settings import Settings

LIMIT = 4096
LONG = "the film was wonderful and " * 40  # far past the tiny models' 64-token window
SHORT = "a wonderful film"


def _client(repository: Path, **knobs: object) -> Iterator[TestClient]:
    settings = Settings(
        model_repository=repository, warmup=False, max_body_bytes=LIMIT, max_text_chars=2000, **knobs
    )
    with TestClient(create_app(settings)) as client:
        yield client


@pytest.fixture(scope="module")
def client(tiny_repository: Path) -> Iterator[TestClient]:
    yield from _client(tiny_repository)


@pytest.fixture(scope="module")
def rejecting(tiny_repository: Path) -> Iterator[TestClient]:
    yield from _client(tiny_repository, truncation="reject")


def test_a_declared_oversized_body_is_refused_unread(client: TestClient) -> None:
    body = b'{"inputs": "' + b"x" * LIMIT + b'"}'
    r = client.post("/v1/classify", content=body, headers={"content-type": "application/json"})
    assert r.status_code == 413, r.text
    assert r.json()["error_type"] == "too_large"
    assert f"is {len(body)} bytes, over the limit of {LIMIT} bytes" in r.json()["error"]


def test_a_chunked_oversized_body_is_counted_and_refused(client: TestClient) -> None:
    def chunks() -> Iterator[bytes]:
        yield b'{"inputs": "'
        for _ in range(8):
            yield b"x" * 1024
        yield b'"}'

    r = client.post("/v1/classify", content=chunks(), headers={"content-type": "application/json"})
    assert r.request.headers.get("transfer-encoding") == "chunked"
    assert "content-length" not in r.request.headers
    assert r.status_code == 413, r.text
    assert f"over the limit of {LIMIT} bytes" in r.json()["error"]


def test_a_body_within_the_limit_is_served(client: TestClient) -> None:
    r = client.post("/v1/classify", json={"inputs": "y" * 1000})
    assert r.status_code == 200, r.text


def test_the_limit_stops_reading_at_the_first_byte_over() -> None:
    """Pure ASGI, many chunks: the app never sees the rest, the client gets 413 and our JSON shape."""
    pulled: list[int] = []
    sent: list[Message] = []

    async def receive() -> Message:
        pulled.append(1)
        return {"type": "http.request", "body": b"x" * 100, "more_body": True}

    async def send(message: Message) -> None:
        sent.append(message)

    async def reads_everything(scope: Scope, receive: Receive, send: Send) -> None:
        while (await receive()).get("more_body"):
            pass

    scope: Scope = {"type": "http", "method": "POST", "path": "/v1/classify", "headers": []}
    asyncio.run(BodyLimitMiddleware(reads_everything, max_bytes=250)(scope, receive, send))
    assert len(pulled) == 3  # 300 bytes > 250: the third chunk is the last one read
    assert sent[0]["status"] == 413
    assert b"too_large" in sent[1]["body"]


def test_a_text_over_the_character_cap_is_422(client: TestClient) -> None:
    r = client.post("/v1/classify", json={"inputs": [SHORT, "z" * 2001]})
    assert r.status_code == 422 and r.json()["error"] == "input 1 is 2001 characters, at most 2000"
    r = client.post("/v1/qa", json={"question": "Who?", "context": "w " * 1001})
    assert r.status_code == 422 and "the context is 2002 characters, at most 2000" in r.json()["error"]
    r = client.post("/v1/fill-mask", json={"inputs": "[MASK] " + "q" * 2000})
    assert r.status_code == 422 and "at most 2000" in r.json()["error"]


def test_long_texts_are_truncated_and_the_header_says_how_many(client: TestClient) -> None:
    r = client.post("/v1/classify", json={"inputs": [SHORT, LONG, LONG]})
    assert r.status_code == 200, r.text
    assert r.headers["X-Distilserve-Truncated"] == "2"
    assert [len(row) for row in r.json()] == [1, 1, 1]  # the HF pipeline's shape is untouched
    one = client.post("/v1/classify", json={"inputs": SHORT})
    assert one.headers["X-Distilserve-Truncated"] == "0"
    assert set(one.json()[0]) == {"label", "score", "model"}
    masked = client.post("/v1/fill-mask", json={"inputs": "I loved this [MASK]. " + LONG})
    assert masked.status_code == 200 and masked.headers["X-Distilserve-Truncated"] == "1"


def test_reject_mode_refuses_texts_past_the_window(rejecting: TestClient) -> None:
    r = rejecting.post("/v1/classify", json={"inputs": [SHORT, LONG]})
    assert r.status_code == 422
    assert "input 1 is longer than the model's window of 64 tokens" in r.json()["error"]
    assert "X-Distilserve-Truncated" not in r.headers
    ok = rejecting.post("/v1/classify", json={"inputs": SHORT})
    assert ok.status_code == 200 and ok.headers["X-Distilserve-Truncated"] == "0"
    masked = rejecting.post("/v1/fill-mask", json={"inputs": "I loved this [MASK]. " + LONG})
    assert masked.status_code == 422 and "the input is longer than" in masked.json()["error"]


def test_qa_splits_long_contexts_instead_of_truncating(rejecting: TestClient) -> None:
    r = rejecting.post("/v1/qa", json={"question": "Who?", "context": LONG})
    assert r.status_code == 200, r.text
    assert "X-Distilserve-Truncated" not in r.headers


def test_the_existing_4xx_are_kept(client: TestClient) -> None:
    assert client.post("/v1/classify", json={"inputs": "ok", "model": "nope"}).status_code == 404
    text = client.post("/v1/classify", content=b'{"inputs": "ok"}', headers={"content-type": "text/plain"})
    assert text.status_code == 415
    assert client.post("/v1/classify", json={"inputs": ["ok"] * 65}).status_code == 422
    assert client.post("/v1/classify", json={"inputs": "ok", "top_k": 0}).status_code == 422


def test_the_knobs_read_their_env_vars(monkeypatch: pytest.MonkeyPatch) -> None:
    for name, value in {
        "MAX_BODY_BYTES": "2048",
        "MAX_TEXT_CHARS": "10",
        "TRUNCATION": "reject",
        "PROTECT_METRICS": "1",
        "LOG_FORMAT": "text",
        "SHUTDOWN_GRACE_S": "5",
    }.items():
        monkeypatch.setenv(f"DISTILSERVE_{name}", value)
    s = Settings()
    assert (s.max_body_bytes, s.max_text_chars, s.truncation) == (2048, 10, "reject")
    assert (s.protect_metrics, s.log_format, s.shutdown_grace_s) == (True, "text", 5.0)
    monkeypatch.setenv("DISTILSERVE_TRUNCATION", "sometimes")
    with pytest.raises(ValueError, match="truncation"):
        Settings()
