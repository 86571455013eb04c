"""A live service on the tiny repository and a tritonclient for it, one per test module."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
import tritonclient.grpc as triton_grpc
import tritonclient.http as triton

from tests.service.live_server import free_port, live_server
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


@pytest.fixture(scope="module")
def grpc_port() -> int:
    """The gRPC port of a module whose server serves gRPC (its `base_url` sets DISTILSERVE_GRPC_PORT)."""
    return free_port()


@pytest.fixture(scope="module")
def grpc_client(base_url: str, grpc_port: int) -> Iterator[triton_grpc.InferenceServerClient]:
    c = triton_grpc.InferenceServerClient(f"127.0.0.1:{grpc_port}")
    yield c
    c.close()
