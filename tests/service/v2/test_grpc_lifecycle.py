"""gRPC's life around the requests, each test on a server of its own: API keys, a full queue and the drain
(SIGTERM) on a server whose classifier is slow; started and stopped with the app's lifespan, off on port 0,
Triton's port by default. The requests themselves are test_grpc.py's."""

from __future__ import annotations

import signal
import socket
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import grpc
import pytest
import tritonclient.grpc as triton_grpc
from fastapi.testclient import TestClient
from tritonclient.grpc import service_pb2

from service.app import create_app
from service.settings import Settings
from tests.service.live_server import free_port
from tests.service.slow_server import running_slow_server
from tests.service.v2.helpers import CLS, grpc_stub, text_tensor

# -- keys, a full queue and the drain, on a server whose classifier is slow ------------------------------

KEY = "grpc-test-key"


def _one_text(key: str | None = KEY) -> tuple[Any, tuple[tuple[str, str], ...]]:
    request = service_pb2.ModelInferRequest(model_name=CLS, inputs=[text_tensor("TEXT", ["fine"])])
    return request, ((("authorization", f"Bearer {key}"),) if key is not None else ())


def test_keys_a_full_queue_and_the_drain(tiny_repository: Path) -> None:
    grpc_port = free_port()
    env = {
        "SLOW_ENGINE_S": "1.0",
        "DISTILSERVE_MAX_QUEUE": "1",
        "DISTILSERVE_API_KEYS": KEY,
        "DISTILSERVE_GRPC_PORT": str(grpc_port),
    }
    with running_slow_server(tiny_repository, env) as (_, process):
        channel, stub = grpc_stub(grpc_port)
        with channel:
            # keys: the probes are open, everything else needs one, as over HTTP
            assert stub.ServerLive(service_pb2.ServerLiveRequest()).live
            assert stub.ServerReady(service_pb2.ServerReadyRequest()).ready
            for key, message in ((None, "an API key is required"), ("wrong", "the API key is not valid")):
                request, metadata = _one_text(key)
                for rpc, body in (
                    (stub.ModelInfer, request),
                    (stub.ModelReady, service_pb2.ModelReadyRequest(name=CLS)),
                    (stub.ServerMetadata, service_pb2.ServerMetadataRequest()),
                ):
                    with pytest.raises(grpc.RpcError) as refused:
                        rpc(body, metadata=metadata)
                    assert refused.value.code() == grpc.StatusCode.UNAUTHENTICATED
                    assert message in refused.value.details()
            request, metadata = _one_text()
            assert stub.ModelReady(service_pb2.ModelReadyRequest(name=CLS), metadata=metadata).ready

            # a full queue: one call runs, one waits, the others are told to come back later
            def call(_: int) -> grpc.StatusCode | tuple[grpc.StatusCode, str]:
                try:
                    stub.ModelInfer(request, metadata=metadata, timeout=30)
                    return grpc.StatusCode.OK
                except grpc.RpcError as e:
                    return e.code(), dict(e.trailing_metadata()).get("retry-after", "")

            with ThreadPoolExecutor(6) as pool:
                outcomes = list(pool.map(call, range(6)))
            assert outcomes.count(grpc.StatusCode.OK) >= 1
            refused = [o for o in outcomes if o != grpc.StatusCode.OK]
            assert refused and all(
                code == grpc.StatusCode.RESOURCE_EXHAUSTED and int(after) >= 1 for code, after in refused
            ), outcomes

            # SIGTERM: the call in flight finishes, a new one is refused as UNAVAILABLE
            finished: list[Any] = []
            running = threading.Thread(
                target=lambda: finished.append(stub.ModelInfer(request, metadata=metadata, timeout=30))
            )
            running.start()
            time.sleep(0.3)
            process.send_signal(signal.SIGTERM)
            time.sleep(0.3)
            with pytest.raises(grpc.RpcError) as late:
                stub.ModelInfer(request, metadata=metadata, timeout=10)
            assert (
                late.value.code() == grpc.StatusCode.UNAVAILABLE and "shutting down" in late.value.details()
            )
            running.join(30)
            assert len(finished) == 1 and finished[0].outputs[0].name == "LABEL"
        process.wait(60)


# -- in process: started with the app's lifespan, and not at all on port 0 ------------------------------


def _listening(port: int) -> bool:
    with socket.socket() as s:
        return s.connect_ex(("127.0.0.1", port)) == 0


def test_the_lifespan_starts_and_stops_it_and_port_0_turns_it_off(tiny_repository: Path) -> None:
    port = free_port()
    settings = Settings(model_repository=tiny_repository, warmup=False, grpc_port=port)
    app = create_app(settings, grpc=True)
    with TestClient(app):
        assert app.state.grpc is not None
        c = triton_grpc.InferenceServerClient(f"127.0.0.1:{port}")
        assert c.is_server_ready() and c.is_model_ready(CLS)
        c.close()
    assert not _listening(port)
    with TestClient(create_app(settings)):  # an app built without `grpc` (tests, embedding) binds nothing
        assert not _listening(port)
    off = settings.model_copy(update={"grpc_port": 0})
    app = create_app(off, grpc=True)
    with TestClient(app):
        assert app.state.ready and app.state.grpc is None


def test_the_default_port_is_tritons(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("DISTILSERVE_GRPC_PORT", raising=False)
    assert Settings().grpc_port == 8001
    monkeypatch.setenv("DISTILSERVE_GRPC_PORT", "0")
    assert Settings().grpc_port == 0
