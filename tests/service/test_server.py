"""`python -m service` as a user runs it: a real uvicorn on 127.0.0.1, then SIGTERM."""

from __future__ import annotations

import re
import signal
import socket
from pathlib import Path
from urllib.parse import urlsplit

import httpx

from tests.service.live_server import live_server


def test_the_entrypoint_serves_and_stops_cleanly(classification_repository: Path) -> None:
    with live_server(classification_repository, {"DISTILSERVE_MAX_BATCH_SIZE": "8"}) as server:
        response = httpx.post(
            f"{server.base_url}/v1/classify", json={"inputs": ["a wonderful film", "a terrible film"]}
        )
        assert response.status_code == 200
        assert [len(r) for r in response.json()] == [1, 1]
        assert "distilserve_requests_total" in httpx.get(f"{server.base_url}/metrics").text
        code = server.stop()
    # uvicorn shuts down gracefully, then re-raises SIGTERM so supervisors see the signal it got.
    assert code in (0, -signal.SIGTERM), server.output
    assert "Application shutdown complete" in server.output
    assert "provider=CPUExecutionProvider" in server.output  # the provider in use is logged at start-up


def test_no_byte_past_a_declared_content_length_reaches_the_app(classification_repository: Path) -> None:
    """The body cap trusts a declared Content-Length under it (it no longer counts such a body): uvicorn
    frames the body by it, so a client that sends more than it declared cannot slip the rest past the cap."""
    with live_server(classification_repository, {"DISTILSERVE_MAX_BODY_BYTES": "1024"}) as server:
        address = urlsplit(server.base_url)
        body = b'{"inputs": "' + b"x" * 4096 + b'"}'
        head = b"POST /v1/classify HTTP/1.1\r\nHost: t\r\nContent-Type: application/json\r\n"
        head += b"Content-Length: 20\r\n"
        with socket.create_connection((address.hostname, address.port), timeout=30) as s:
            s.sendall(head + b"\r\n" + body)
            reply = b""
            while chunk := s.recv(65536):
                reply += chunk
        # The app got the 20 declared bytes (an unfinished JSON string: 422, when its answer goes out before
        # uvicorn's); the bytes after them were parsed as the next request, a malformed one (400, closed).
        statuses = re.findall(rb"HTTP/1.1 (\d+)", reply)
        assert statuses and set(statuses) <= {b"400", b"422"}, reply[:300]
