"""A live service on the tiny repository and a tritonclient for it, one per test module."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
import tritonclient.http as triton

from tests.service.live_server import live_server
from tests.service.v2.helpers import MAX_CLIENT_BATCH


@pytest.fixture(scope="module")
def base_url(tiny_repository: Path) -> Iterator[str]:
    env = {"DISTILSERVE_MAX_CLIENT_BATCH": str(MAX_CLIENT_BATCH)}
    with live_server(tiny_repository, env) as server:
        yield server.base_url


@pytest.fixture(scope="module")
def client(base_url: str) -> Iterator[triton.InferenceServerClient]:
    c = triton.InferenceServerClient(base_url.removeprefix("http://"))
    yield c
    c.close()
