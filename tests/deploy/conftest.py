"""One real `python -m service` on the tiny repository for the deployment checks, traffic already served."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

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
    # a paired student (conftest's pair_repository): one request it answers alone (each input then checked
    # by its teacher: DISTILSERVE_SHADOW_RATE=1), one it hands to its teacher whole
    ("/v1/classify", {"inputs": ["a wonderful film", "dull"], "model": "cls", "cascade_threshold": 0.0}, 200),
    ("/v1/classify", {"inputs": ["a wonderful film", "dull"], "model": "cls", "cascade_threshold": 1.0}, 200),
    # an embedding student (conftest's embedding_pair): its vectors checked by its teacher, its documents
    # counted by the passage cache
    ("/v1/rerank", {"query": "Who founded Acme?", "documents": ["Acme was founded in 1950.", "a film"]}, 200),
]


def serve_traffic(base_url: str) -> None:
    with httpx.Client(base_url=base_url, timeout=30) as client:
        for path, body, status in TRAFFIC:
            response = client.post(path, json=body)
            assert response.status_code == status, (path, body, response.text)


@pytest.fixture(scope="package")
def deploy_repository(
    tiny_repository: Path,
    pair_repository: Path,
    embedding_pair: dict[str, Any],
    tmp_path_factory: pytest.TempPathFactory,
) -> Path:
    """A model per task, and a student/teacher pair per encoder task and for sentence embeddings, in one
    repository."""
    import shutil

    repository = tmp_path_factory.mktemp("deploy-models")
    for source in (tiny_repository, pair_repository, embedding_pair["repository"]):
        for model in source.iterdir():
            shutil.copytree(model, repository / model.name)
    return repository


@pytest.fixture(scope="package", params=[1, 2], ids=["one-frontend", "two-frontends"])
def served(
    deploy_repository: Path, request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[LiveServer]:
    """The service on a free 127.0.0.1 port with TRAFFIC answered; stopped after the package's tests.
    With one frontend, and with two (whose /metrics is their sum with the engine core's: what Prometheus, the
    alerts and the dashboard read must hold for both)."""
    capture = tmp_path_factory.mktemp("capture")  # what the pairs' teachers answer is kept
    env = {
        "DISTILSERVE_FRONTENDS": str(request.param),
        "DISTILSERVE_SHADOW_RATE": "1.0",
        "DISTILSERVE_CAPTURE_DIR": str(capture),
    }
    with live_server(deploy_repository, env) as server:
        serve_traffic(server.base_url)
        yield server
