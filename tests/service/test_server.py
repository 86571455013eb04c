"""`python -m service` as a user runs it: a real uvicorn on 127.0.0.1, then SIGTERM."""

from __future__ import annotations

import signal
from pathlib import Path

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
