"""The v2 protocol's extensions as tritonclient reads them: model configuration, model repository index and
statistics, against a real uvicorn serving one model per task."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import httpx
import pytest
import tritonclient.http as triton
from tritonclient.utils import InferenceServerException

from service.api.v2 import PLATFORM
from service.api.v2_extensions import model_config
from service.metrics import Metrics
from service.repository import scan_repository
from service.runtime import load_engine_model, ort_engine_factory
from service.served import local_model
from service.settings import Settings
from tests.service.v2.helpers import (
    CLS,
    LM,
    MAX_CLIENT_BATCH,
    MLM,
    QA,
    texts_input,
    v1,
)


def _model_cards(base_url: str) -> dict[tuple[str, int], dict[str, Any]]:
    response = httpx.get(f"{base_url}/v1/models")
    assert response.status_code == 200, response.text
    return {(m["name"], m["version"]): m for m in response.json()["models"]}


def test_server_metadata_lists_the_extensions(client: triton.InferenceServerClient) -> None:
    extensions = set(client.get_server_metadata()["extensions"])
    assert {"model_configuration", "model_repository", "statistics"} <= extensions


def test_model_config_describes_what_is_served(client: triton.InferenceServerClient, base_url: str) -> None:
    """Inputs and outputs are the metadata's tensors without the batch axis; the rest is what is loaded."""
    types = {"BYTES": "TYPE_STRING", "FP32": "TYPE_FP32", "INT64": "TYPE_INT64"}
    cards = _model_cards(base_url)
    for name in (CLS, QA, MLM, LM):
        config, metadata = client.get_model_config(name), client.get_model_metadata(name)
        card = cards[(name, 1)]
        assert (config["name"], config["platform"], config["backend"]) == (name, PLATFORM, "onnxruntime")
        assert config["max_batch_size"] == MAX_CLIENT_BATCH
        for kind in ("input", "output"):
            declared = [(t["name"], types[t["datatype"]], t["shape"]) for t in metadata[kind + "s"]]
            assert [(t["name"], t["data_type"], [-1, *t["dims"]]) for t in config[kind]] == declared
        kind = "KIND_GPU" if card["provider"] == "CUDAExecutionProvider" else "KIND_CPU"
        assert [(g["kind"], g["count"]) for g in config["instance_group"]] == [(kind, card["instances"])]
        assert config["dynamic_batching"]["max_queue_delay_microseconds"] == 0  # DISTILSERVE_MAX_WAIT_MS
        assert config["version_policy"] == {"all": {}}
        assert config["parameters"]["task"] == {"string_value": card["task"]}
        assert client.get_model_config(name, "1") == config
    assert [t["dims"] for t in client.get_model_config(CLS)["output"]] == [[], [], [2], []]


def test_model_config_follows_the_settings(tiny_repository: Path) -> None:
    settings = Settings(model_repository=tiny_repository, max_client_batch=7, max_wait_ms=2.5, instances=3)
    (version,) = [v for v in scan_repository(tiny_repository).versions if v.name == CLS]
    engine_model = load_engine_model(version, settings, Metrics(), ort_engine_factory)
    try:
        model = local_model(engine_model, settings, Metrics())
        config = model_config(model, settings)
    finally:
        engine_model.executor.shutdown()
    assert (config.max_batch_size, config.dynamic_batching.max_queue_delay_microseconds) == (7, 2500)
    assert [(g.kind, g.count) for g in config.instance_group] == [("KIND_CPU", 3)]
    assert config.default_model_filename == version.manifest.variants["fp32"].file


def test_repository_index_lists_every_served_version(
    client: triton.InferenceServerClient, base_url: str
) -> None:
    served = sorted((name, str(version), "READY") for name, version in _model_cards(base_url))
    index = client.get_model_repository_index()
    assert sorted((e["name"], e["version"], e["state"]) for e in index) == served
    ready_only = httpx.post(f"{base_url}/v2/repository/index", json={"ready": True})
    assert ready_only.status_code == 200 and ready_only.json() == index
    bad = httpx.post(f"{base_url}/v2/repository/index", content=b'{"ready": "maybe"}')
    assert bad.status_code == 400 and "ready" in bad.json()["error"]
    # A read, though a POST: not counted as a request refused before a model was chosen (model="").
    assert 'distilserve_requests_total{model="",status="200"' not in httpx.get(f"{base_url}/metrics").text


def test_the_repository_is_fixed_at_start_up(client: triton.InferenceServerClient) -> None:
    for call in (client.load_model, client.unload_model):
        with pytest.raises(InferenceServerException) as caught:
            call(CLS)
        assert caught.value.status() == "400" and "fixed at start-up" in (caught.value.message() or "")


def _stats(client: triton.InferenceServerClient, name: str) -> dict[str, Any]:
    (stat,) = client.get_inference_statistics(name)["model_stats"]
    return dict(stat)


def _moved(before: dict[str, Any], after: dict[str, Any], key: str) -> tuple[int, int]:
    """How much one inference_stats entry's count and ns grew."""
    b, a = before["inference_stats"][key], after["inference_stats"][key]
    return a["count"] - b["count"], a["ns"] - b["ns"]


def _sequences_run(before: dict[str, Any], after: dict[str, Any]) -> int:
    """Sequences the engine calls in between took: batch size x calls, summed."""

    def total(stat: dict[str, Any]) -> int:
        return sum(b["batch_size"] * b["compute_infer"]["count"] for b in stat["batch_stats"])

    return total(after) - total(before)


def test_statistics_count_requests_items_and_engine_calls(
    client: triton.InferenceServerClient, base_url: str
) -> None:
    before = _stats(client, CLS)
    for text in ("fine", "awful", "so-so"):
        client.infer(CLS, [texts_input("TEXT", [text])])
    client.infer(CLS, [texts_input("TEXT", ["one", "two", "three"])])
    v1(base_url, "/v1/classify", {"inputs": "also counted"})  # a model's statistics cover every protocol
    after = _stats(client, CLS)
    assert (after["name"], after["version"]) == (CLS, "1")
    assert after["inference_count"] - before["inference_count"] == 3 + 3 + 1
    success, success_ns = _moved(before, after, "success")
    assert success == 5 and success_ns > 0
    for key in ("queue", "compute_input", "compute_infer"):
        count, ns = _moved(before, after, key)
        assert count == 5 and ns > 0, key
    assert after["execution_count"] - before["execution_count"] >= 5  # one request at a time, each its own
    assert _sequences_run(before, after) == 7  # every text is one sequence
    assert after["last_inference"] >= before["last_inference"] and after["last_inference"] > 0
    assert _moved(before, after, "fail") == (0, 0)

    with pytest.raises(InferenceServerException):
        client.infer(CLS, [texts_input("TEXT", ["ok", " "])])
    failed = _stats(client, CLS)
    fail, fail_ns = _moved(after, failed, "fail")
    assert fail == 1 and fail_ns > 0 and failed["inference_count"] == after["inference_count"]


def test_statistics_of_generation_count_its_prefill_and_decode_calls(
    client: triton.InferenceServerClient,
) -> None:
    before = _stats(client, LM)
    client.infer(LM, [texts_input("PROMPT", ["Acme was", "The film"])], parameters={"max_new_tokens": 3})
    after = _stats(client, LM)
    assert after["inference_count"] - before["inference_count"] == 2
    assert _moved(before, after, "success")[0] == 1 and _moved(before, after, "compute_input")[1] > 0
    executions = after["execution_count"] - before["execution_count"]
    assert executions >= 2  # a prefill, then decode steps
    calls = sum(b["compute_infer"]["count"] for b in after["batch_stats"])
    assert calls - sum(b["compute_infer"]["count"] for b in before["batch_stats"]) == executions


def test_statistics_of_all_models_and_of_one_version(client: triton.InferenceServerClient) -> None:
    every = client.get_inference_statistics()["model_stats"]
    assert {(s["name"], s["version"]) for s in every} == {(n, "1") for n in (CLS, QA, MLM, LM)}
    (one,) = client.get_inference_statistics(MLM, "1")["model_stats"]
    assert (one["name"], one["version"]) == (MLM, "1") and set(one["inference_stats"]) >= {
        "success",
        "fail",
        "queue",
        "compute_input",
        "compute_infer",
        "compute_output",
    }
