"""Slow and idle clients cannot hold the server: a trickled body or silent connection is cut with a 408,
and connections beyond the cap get a 503 while requests in flight go on (a real uvicorn)."""

from __future__ import annotations

import socket
import time
from collections.abc import Iterator
from pathlib import Path
from urllib.parse import urlsplit

import httpx
import pytest

from tests.service.live_server import LiveServer, live_server

GUARDED = {
    "DISTILSERVE_HEADER_TIMEOUT_S": "1",
    "DISTILSERVE_BODY_TIMEOUT_S": "1",
    "DISTILSERVE_MAX_CONNECTIONS": "16",
    "DISTILSERVE_FRONTENDS": "1",
    "DISTILSERVE_WARMUP": "false",
}


@pytest.fixture(scope="module")
def server(tiny_repository: Path) -> Iterator[LiveServer]:
    with live_server(tiny_repository, GUARDED) as s:
        yield s


def connect(server: LiveServer) -> socket.socket:
    port = urlsplit(server.base_url).port
    assert port is not None
    return socket.create_connection(("127.0.0.1", port), timeout=10)


def read_all(sock: socket.socket) -> bytes:
    """What the server sends until it closes the connection."""
    chunks = []
    while chunk := sock.recv(65536):
        chunks.append(chunk)
    return b"".join(chunks)


def classify(server: LiveServer) -> int:
    return httpx.post(
        f"{server.base_url}/v1/classify", json={"inputs": "a fine film"}, timeout=10
    ).status_code


def test_a_body_trickled_past_the_timeout_gets_a_408_while_others_are_served(server: LiveServer) -> None:
    slow = connect(server)
    slow.sendall(
        b"POST /v1/classify HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\n"
        b"content-length: 100\r\n\r\n" + b'{"inputs": "'
    )
    started = time.monotonic()
    assert [classify(server) for _ in range(5)] == [200] * 5  # the slow one holds nobody meanwhile
    slow.sendall(b"a")  # still trickling
    answer = read_all(slow)
    assert answer.startswith(b"HTTP/1.1 408 ") and b"did not arrive in time" in answer
    assert 0.9 <= time.monotonic() - started < 8
    slow.close()


def test_a_connection_that_sends_nothing_is_closed(server: LiveServer) -> None:
    idle = connect(server)
    started = time.monotonic()
    assert read_all(idle).startswith(b"HTTP/1.1 408 ")
    assert 0.9 <= time.monotonic() - started < 8
    idle.close()


def test_connections_beyond_the_cap_get_a_503_and_requests_in_flight_go_on(server: LiveServer) -> None:
    body = {"prompt": "The film was", "max_new_tokens": 48, "ignore_eos": True, "stream": True}
    with (
        httpx.Client(timeout=20) as client,
        client.stream("POST", f"{server.base_url}/v1/generate", json=body) as in_flight,
    ):
        assert in_flight.status_code == 200
        held = [connect(server) for _ in range(16)]  # at the cap: silent until the header timeout
        try:
            time.sleep(0.2)
            refused = httpx.post(f"{server.base_url}/v1/classify", json={"inputs": "x"}, timeout=10)
            assert refused.status_code == 503
            events = [line for line in in_flight.iter_lines() if line.startswith("data: ")]
        finally:
            for sock in held:
                sock.close()
    assert '"finish_reason":"length"' in events[-1]  # the stream in flight ran to its end
    deadline = time.monotonic() + 10
    while classify(server) != 200:  # the held ones are gone: served again
        assert time.monotonic() < deadline
        time.sleep(0.1)
