"""Model control against `python -m service` with two frontends (the engine core loads; each frontend must
route to the new version before the old one drains): explicit load and unload through tritonclient.http and
tritonclient.grpc, behind the API key; under `poll`, a version exported while a load runs takes over within
the poll interval with no failed request."""

from __future__ import annotations

import shutil
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
import tritonclient.grpc as triton_grpc
import tritonclient.http as triton
from tritonclient.utils import InferenceServerException

from tests.service.live_server import live_server
from tests.service.v2.helpers import CLS

KEY = "model-control-key"
AUTH = {"Authorization": f"Bearer {KEY}"}
GRPC_AUTH = {"authorization": f"Bearer {KEY}"}  # gRPC metadata keys are lower case
POLL_S = 0.5


@pytest.fixture(scope="module")
def repository(tmp_path_factory: pytest.TempPathFactory, tiny_repository: Path) -> Path:
    root = tmp_path_factory.mktemp("control-repo")
    for name in (CLS, "tiny-qa"):
        shutil.copytree(tiny_repository / name, root / name)
    return root


@pytest.fixture(scope="module")
def base_url(repository: Path, grpc_port: int) -> Iterator[str]:
    env = {
        "DISTILSERVE_MODEL_CONTROL": "explicit",
        "DISTILSERVE_GRPC_PORT": str(grpc_port),
        "DISTILSERVE_FRONTENDS": "2",
        "DISTILSERVE_API_KEYS": KEY,
    }
    with live_server(repository, env) as server:
        yield server.base_url


def _states(index: list[dict[str, str]]) -> dict[tuple[str, str], str]:
    return {(e["name"], e["version"]): e.get("state", "") for e in index}


def test_explicit_unload_and_load_through_tritonclient_http(
    client: triton.InferenceServerClient, base_url: str
) -> None:
    with pytest.raises(InferenceServerException) as refused:
        client.unload_model(CLS)  # no key
    assert "401" in str(refused.value)
    client.unload_model(CLS, headers=AUTH)
    assert not client.is_model_ready(CLS, headers=AUTH)
    # every frontend routes by the new set: a new connection each time reaches either of the two
    for _ in range(4):
        r = httpx.post(f"{base_url}/v1/classify", json={"inputs": ["fine"]}, headers=AUTH)
        assert r.status_code == 404, r.text
    index = client.get_model_repository_index(headers=AUTH)
    assert _states(index)[(CLS, "1")] == "UNAVAILABLE"
    client.load_model(CLS, headers=AUTH)
    assert client.is_model_ready(CLS, headers=AUTH)
    for _ in range(4):
        r = httpx.post(f"{base_url}/v1/classify", json={"inputs": ["fine"]}, headers=AUTH)
        assert r.status_code == 200, r.text
    with pytest.raises(InferenceServerException) as missing:
        client.load_model("no-such-model", headers=AUTH)
    assert "404" in str(missing.value) or "no model" in str(missing.value)


def test_explicit_unload_and_load_through_tritonclient_grpc(
    grpc_client: triton_grpc.InferenceServerClient,
) -> None:
    grpc_client.unload_model("tiny-qa", headers=GRPC_AUTH)
    assert not grpc_client.is_model_ready("tiny-qa", headers=GRPC_AUTH)
    index = grpc_client.get_model_repository_index(headers=GRPC_AUTH, as_json=True)["models"]
    assert _states(index)[("tiny-qa", "1")] == "UNAVAILABLE"
    grpc_client.load_model("tiny-qa", headers=GRPC_AUTH)
    assert grpc_client.is_model_ready("tiny-qa", headers=GRPC_AUTH)
    result = grpc_client.infer(CLS, [_grpc_texts(["fine"])], headers=GRPC_AUTH)
    assert result.get_response().model_version == "1"
    with pytest.raises(InferenceServerException) as missing:
        grpc_client.load_model("no-such-model", headers=GRPC_AUTH)
    assert missing.value.status() == "StatusCode.NOT_FOUND"
    with pytest.raises(InferenceServerException) as unauthenticated:
        grpc_client.unload_model(CLS)
    assert unauthenticated.value.status() == "StatusCode.UNAUTHENTICATED"


def _grpc_texts(texts: list[str]) -> triton_grpc.InferInput:
    import numpy as np

    tensor = triton_grpc.InferInput("TEXT", [len(texts)], "BYTES")
    return tensor.set_data_from_numpy(np.array(texts, dtype=object))


def test_poll_switches_under_load_with_no_failed_request(
    tmp_path: Path, tiny_repository: Path, tiny_models: dict[str, Path]
) -> None:
    from export.pipeline import export_model

    root = tmp_path / "models"
    shutil.copytree(tiny_repository / CLS, root / CLS)
    env = {
        "DISTILSERVE_MODEL_CONTROL": "poll",
        "DISTILSERVE_REPOSITORY_POLL_S": str(POLL_S),
        "DISTILSERVE_FRONTENDS": "2",
        "DISTILSERVE_GRPC_PORT": "0",
    }
    with live_server(root, env) as server:
        answers: list[tuple[float, int, str]] = []  # (when, status, version)
        stop = threading.Event()

        def load() -> None:
            with httpx.Client(base_url=server.base_url) as http:  # one connection: one frontend
                while not stop.is_set():
                    try:
                        r = http.post(f"/v2/models/{CLS}/infer", json=_infer_body())
                    except httpx.HTTPError as e:  # no answer at all is a failure too
                        answers.append((time.monotonic(), 0, repr(e)))
                        continue
                    version = r.json().get("model_version", "") if r.status_code == 200 else r.text
                    answers.append((time.monotonic(), r.status_code, version))

        threads = [threading.Thread(target=load) for _ in range(4)]
        for t in threads:
            t.start()
        try:
            time.sleep(0.5)
            result = export_model(
                tiny_models["text-classification"], "text-classification", CLS, root, ("fp32",)
            )
            assert result.version_dir is not None and result.version_dir.name == "2"
            exported = time.monotonic()
            deadline = exported + 60
            while not any(v == "2" for _, _, v in answers[-8:]) and time.monotonic() < deadline:
                time.sleep(0.05)
            time.sleep(1.0)  # the old version drains and is unloaded meanwhile
        finally:
            stop.set()
            for t in threads:
                t.join()
        failed = [(s, v) for _, s, v in answers if s != 200]
        assert not failed, (failed[:5], server.process.pid)
        index = httpx.post(f"{server.base_url}/v2/repository/index").json()
        switched = [t for t, _, v in answers if v == "2"]
        assert switched, (index, len(answers))
        first_2 = min(switched)
        assert all(v == "2" for t, _, v in answers if t > first_2 + 1.0)
        # within the poll interval and the new version's validation, load and warm-up (generous on 2 cores)
        assert first_2 - exported < POLL_S + 20
        index = httpx.post(f"{server.base_url}/v2/repository/index").json()
        assert _states(index) == {(CLS, "1"): "UNAVAILABLE", (CLS, "2"): "READY"}


def _infer_body() -> dict[str, object]:
    return {"inputs": [{"name": "TEXT", "datatype": "BYTES", "shape": [1], "data": ["a fine film"]}]}
