"""One real `python -m service` on the tiny repository for the deployment checks, traffic already served."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from tests.service.live_server import LiveServer, live_server

# One request of every kind, so every metric family has series (labels included) before anything reads it.
TRAFFIC: list[tuple[str, dict[str, object], int]] = [
    ("/v1/classify", {"inputs": ["a wonderful film", "a dull and boring film"]}, 200),
    ("/v1/qa", {"question": "Who founded Acme?", "context": "Acme was founded by Ada Smith in 1950."}, 200),
    ("/v1/fill-mask", {"inputs": "I loved this [MASK]."}, 200),
    ("/v1/generate", {"prompt": "The film was", "max_new_tokens": 4}, 200),
    ("/v1/generate", {"prompt": "The film was", "max_new_tokens": 4, "stream": True}, 200),
    ("/v1/classify", {"inputs": ""}, 422),
]


def serve_traffic(base_url: str) -> None:
    with httpx.Client(base_url=base_url, timeout=30) as client:
        for path, body, status in TRAFFIC:
            response = client.post(path, json=body)
            assert response.status_code == status, (path, body, response.text)


@pytest.fixture(scope="package", params=[1, 2], ids=["one-frontend", "two-frontends"])
def served(tiny_repository: Path, request: pytest.FixtureRequest) -> Iterator[LiveServer]:
    """The service on a free 127.0.0.1 port with TRAFFIC answered; stopped after the package's tests.
    With one frontend, and with two (whose /metrics is their sum with the engine core's: what Prometheus, the
    alerts and the dashboard read must hold for both)."""
    with live_server(tiny_repository, {"DISTILSERVE_FRONTENDS": str(request.param)}) as server:
        serve_traffic(server.base_url)
        yield server
