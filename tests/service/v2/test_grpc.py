"""The Open Inference Protocol over gRPC as tritonclient.grpc speaks it, against `python -m service` (two
frontends sharing the gRPC port) serving one model per task.

Every answer is checked against /v2 over HTTP on the same server (tritonclient.http): the same outputs, and
the same errors as gRPC status codes with the same messages.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path
from types import ModuleType
from typing import Any

import grpc
import numpy as np
import pytest
import tritonclient.grpc as triton_grpc
import tritonclient.http as triton
from google.protobuf import json_format
from tritonclient.grpc import model_config_pb2, service_pb2
from tritonclient.utils import InferenceServerException

from service.api.grpc_v2_wire import grpc_status
from service.batch_policy import BatcherClosedError, DeadlineExceededError, QueueFullError
from service.registry import ModelNotFoundError
from service.settings import Settings
from service.tasks.contract import InvalidInputError, TensorError
from tests.service.live_server import live_server
from tests.service.v2.helpers import CLS, CONTEXT, LM, MAX_CLIENT_BATCH, MLM, QA, grpc_stub, text_tensor

Client = Any  # either protocol's tritonclient InferenceServerClient


@pytest.fixture(scope="module")
def base_url(tiny_repository: Path, grpc_port: int) -> Iterator[str]:
    """This module's server (conftest's `client`, the HTTP one, talks to it too)."""
    env = {
        "DISTILSERVE_MAX_CLIENT_BATCH": str(MAX_CLIENT_BATCH),
        "DISTILSERVE_GRPC_PORT": str(grpc_port),
        "DISTILSERVE_FRONTENDS": "2",
    }
    with live_server(tiny_repository, env) as server:
        yield server.base_url


def texts_input(m: ModuleType, name: str, texts: list[str]) -> Any:
    """A BYTES input for either protocol's client (gRPC sends it as raw_input_contents, HTTP as binary)."""
    return m.InferInput(name, [len(texts)], "BYTES").set_data_from_numpy(np.array(texts, dtype=object))


# -- health and metadata ----------------------------------------------------------------------------------


def test_health_and_server_metadata(grpc_client: Client, client: triton.InferenceServerClient) -> None:
    assert grpc_client.is_server_live() and grpc_client.is_server_ready()
    metadata = grpc_client.get_server_metadata()
    expected = client.get_server_metadata()
    assert (metadata.name, metadata.version, list(metadata.extensions)) == (
        expected["name"],
        expected["version"],
        expected["extensions"],
    )


def test_model_readiness(grpc_client: Client) -> None:
    assert all(grpc_client.is_model_ready(name) for name in (CLS, QA, MLM, LM))
    assert grpc_client.is_model_ready(CLS, "1")
    assert not grpc_client.is_model_ready(CLS, "2") and not grpc_client.is_model_ready("no-such-model")


@pytest.mark.parametrize("version", ["", "1"])
@pytest.mark.parametrize("model", [CLS, QA, MLM, LM])
def test_model_metadata_equals_http(
    grpc_client: Client, client: triton.InferenceServerClient, model: str, version: str
) -> None:
    metadata = grpc_client.get_model_metadata(model, version)
    expected = client.get_model_metadata(model, version)

    def tensors(found: Any) -> list[tuple[str, str, list[int]]]:
        return [(t.name, t.datatype, list(t.shape)) for t in found]

    assert (metadata.name, list(metadata.versions), metadata.platform) == (
        expected["name"],
        expected["versions"],
        expected["platform"],
    )
    assert tensors(metadata.inputs) == [(t["name"], t["datatype"], t["shape"]) for t in expected["inputs"]]
    assert tensors(metadata.outputs) == [(t["name"], t["datatype"], t["shape"]) for t in expected["outputs"]]


# -- the four tasks, equal to /v2 over HTTP ---------------------------------------------------------------

TASK_CASES: list[tuple[str, dict[str, list[str]], dict[str, Any]]] = [
    (CLS, {"TEXT": ["I loved this film, it was wonderful", "a dull, terrible film"]}, {}),
    (QA, {"QUESTION": ["Who founded Acme?", "Where is Springfield?"], "CONTEXT": [CONTEXT, CONTEXT]}, {}),
    (MLM, {"TEXT": ["I loved this [MASK], it was wonderful.", "A dull [MASK]."]}, {"top_k": 3}),
    (LM, {"PROMPT": ["Acme was founded by", "The film was"]}, {"max_new_tokens": 6}),
]


def assert_same_outputs(got: dict[str, np.ndarray], expected: dict[str, np.ndarray]) -> None:
    assert list(got) == list(expected)
    for name, array in expected.items():
        assert got[name].shape == array.shape and got[name].dtype == array.dtype, name
        if array.dtype == np.float32:
            np.testing.assert_allclose(got[name], array, atol=1e-6, err_msg=name)
        else:
            assert got[name].tolist() == array.tolist(), name


@pytest.mark.parametrize(("model", "inputs", "parameters"), TASK_CASES, ids=["cls", "qa", "mlm", "lm"])
def test_infer_equals_http(
    grpc_client: Client,
    client: triton.InferenceServerClient,
    model: str,
    inputs: dict[str, list[str]],
    parameters: dict[str, Any],
) -> None:
    names = [o["name"] for o in client.get_model_metadata(model)["outputs"]]
    result = grpc_client.infer(
        model, [texts_input(triton_grpc, n, t) for n, t in inputs.items()], parameters=parameters
    )
    expected = client.infer(
        model, [texts_input(triton, n, t) for n, t in inputs.items()], parameters=parameters
    )
    response = result.get_response()
    assert (response.model_name, response.model_version) == (model, "1")
    assert [o.name for o in response.outputs] == names
    assert len(response.raw_output_contents) == len(names)  # outputs travel raw, as Triton sends them
    assert_same_outputs({n: result.as_numpy(n) for n in names}, {n: expected.as_numpy(n) for n in names})


def test_selected_outputs_classification_and_the_id(grpc_client: Client) -> None:
    wanted = [
        triton_grpc.InferRequestedOutput("SCORES", class_count=1),
        triton_grpc.InferRequestedOutput("LABEL"),
    ]
    result = grpc_client.infer(
        CLS, [texts_input(triton_grpc, "TEXT", ["fine", "awful"])], outputs=wanted, request_id="r-7"
    )
    response = result.get_response()
    assert response.id == "r-7" and [o.name for o in response.outputs] == ["SCORES", "LABEL"]
    top = [s.decode().split(":") for s in result.as_numpy("SCORES").ravel()]
    assert [label for _, _, label in top] == [s.decode() for s in result.as_numpy("LABEL")]
    assert result.as_numpy("SCORE") is None


def test_typed_contents_answer_as_raw_contents(grpc_client: Client, grpc_port: int) -> None:
    """BYTES in `contents.bytes_contents` (KServe's other encoding) read as raw_input_contents do."""
    texts = ["fine", "ünïcode"]
    raw = grpc_client.infer(CLS, [texts_input(triton_grpc, "TEXT", texts)])
    channel, stub = grpc_stub(grpc_port)
    with channel:
        response = stub.ModelInfer(
            service_pb2.ModelInferRequest(model_name=CLS, inputs=[text_tensor("TEXT", texts)])
        )
    assert [o.name for o in response.outputs] == ["LABEL", "SCORE", "SCORES", "MODEL"]
    assert response.raw_output_contents == raw.get_response().raw_output_contents


@pytest.mark.parametrize(
    ("build", "message"),
    [
        (
            lambda r: (
                r.inputs.append(text_tensor("TEXT", ["x"])),
                r.raw_input_contents.append(b"\0\0\0\0"),
            ),
            "either contents or raw_input_contents",
        ),
        (
            lambda r: r.inputs.append(
                service_pb2.ModelInferRequest.InferInputTensor(name="TEXT", datatype="BYTES", shape=[1])
            ),
            "neither contents nor raw_input_contents",
        ),
        (
            lambda r: (
                r.inputs.append(text_tensor("TEXT", ["x"])),
                r.inputs[0].contents.Clear(),
                r.inputs[0].contents.int64_contents.append(7),
            ),
            "input TEXT[0] is int, expected a string",
        ),
        (lambda r: r.raw_input_contents.append(b""), "raw_input_contents holds 1 tensors for 0 inputs"),
    ],
    ids=["both", "neither", "numbers", "raw without inputs"],
)
def test_malformed_requests_are_invalid_argument(
    grpc_port: int, build: Callable[[Any], object], message: str
) -> None:
    request = service_pb2.ModelInferRequest(model_name=CLS)
    build(request)
    channel, stub = grpc_stub(grpc_port)
    with channel, pytest.raises(grpc.RpcError) as caught:
        stub.ModelInfer(request)
    assert caught.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert message in caught.value.details()
    assert "x-request-id" in dict(caught.value.trailing_metadata())


# -- Triton's extensions ----------------------------------------------------------------------------------


def test_repository_index_equals_http(grpc_client: Client, client: triton.InferenceServerClient) -> None:
    index = grpc_client.get_model_repository_index()
    assert [(m.name, m.version, m.state) for m in index.models] == [
        (m["name"], m["version"], m["state"]) for m in client.get_model_repository_index()
    ]


@pytest.mark.parametrize("model", [CLS, QA, MLM, LM])
def test_model_config_equals_http(
    grpc_client: Client, client: triton.InferenceServerClient, model: str
) -> None:
    config = grpc_client.get_model_config(model).config
    assert config == json_format.ParseDict(client.get_model_config(model), model_config_pb2.ModelConfig())
    assert (
        config.max_batch_size == MAX_CLIENT_BATCH
        and config.input[0].data_type == model_config_pb2.TYPE_STRING
    )
    assert grpc_client.get_model_config(model, "1").config == config


def test_statistics_count_grpc_requests(grpc_client: Client) -> None:
    """One connection reaches one frontend: its statistics count the requests it answered."""

    def stats() -> Any:
        (stat,) = grpc_client.get_inference_statistics(CLS, "1").model_stats
        return stat

    before = stats()
    for texts in (["one"], ["two", "three"]):
        grpc_client.infer(CLS, [texts_input(triton_grpc, "TEXT", texts)])
    with pytest.raises(InferenceServerException):
        grpc_client.infer(CLS, [texts_input(triton_grpc, "TEXT", [" "])])
    after = stats()
    assert (after.name, after.version) == (CLS, "1")
    assert after.inference_stats.success.count == before.inference_stats.success.count + 2
    assert after.inference_stats.fail.count == before.inference_stats.fail.count + 1
    assert after.inference_count == before.inference_count + 3
    assert after.execution_count >= before.execution_count + 1 and after.batch_stats
    every = grpc_client.get_inference_statistics().model_stats
    assert {(s.name, s.version) for s in every} == {(m, "1") for m in (CLS, QA, MLM, LM)}
    assert [s.name for s in grpc_client.get_inference_statistics(MLM).model_stats] == [MLM]


def test_load_and_unload_are_refused_as_over_http(grpc_client: Client) -> None:
    for call in (grpc_client.load_model, grpc_client.unload_model):
        with pytest.raises(InferenceServerException) as caught:
            call(CLS)
        assert caught.value.status() == "StatusCode.INVALID_ARGUMENT"
        assert "fixed at start-up" in (caught.value.message() or "")


# -- errors: /v2's status as a gRPC code, with /v2's message ---------------------------------------------


def _wrong_datatype(m: ModuleType) -> list[Any]:
    return [m.InferInput("TEXT", [2], "INT64").set_data_from_numpy(np.array([1, 2], dtype=np.int64))]


Call = Callable[[ModuleType, Client], object]
ERROR_CASES: list[tuple[str, Call, str]] = [
    ("unknown model", lambda m, c: c.infer("no-such-model", [texts_input(m, "TEXT", ["x"])]), "NOT_FOUND"),
    ("unknown version", lambda m, c: c.infer(CLS, [texts_input(m, "TEXT", ["x"])], "7"), "NOT_FOUND"),
    ("bad version", lambda m, c: c.infer(CLS, [texts_input(m, "TEXT", ["x"])], "abc"), "NOT_FOUND"),
    ("unknown model metadata", lambda m, c: c.get_model_metadata("no-such-model"), "NOT_FOUND"),
    ("unknown model config", lambda m, c: c.get_model_config("no-such-model"), "NOT_FOUND"),
    ("unknown version config", lambda m, c: c.get_model_config(CLS, "7"), "NOT_FOUND"),
    ("unknown model stats", lambda m, c: c.get_inference_statistics("no-such-model"), "NOT_FOUND"),
    ("unknown version stats", lambda m, c: c.get_inference_statistics(CLS, "7"), "NOT_FOUND"),
    ("wrong input name", lambda m, c: c.infer(CLS, [texts_input(m, "TXT", ["x"])]), "INVALID_ARGUMENT"),
    ("wrong datatype", lambda m, c: c.infer(CLS, _wrong_datatype(m)), "INVALID_ARGUMENT"),
    (
        "wrong shape",
        lambda m, c: c.infer(CLS, [texts_input(m, "TEXT", ["one", "two"]).set_shape([3])]),
        "INVALID_ARGUMENT",
    ),
    (
        "wrong rank",
        lambda m, c: c.infer(CLS, [texts_input(m, "TEXT", ["one", "two"]).set_shape([1, 2])]),
        "INVALID_ARGUMENT",
    ),
    ("missing input", lambda m, c: c.infer(QA, [texts_input(m, "QUESTION", ["Who?"])]), "INVALID_ARGUMENT"),
    (
        "batch over the limit",
        lambda m, c: c.infer(CLS, [texts_input(m, "TEXT", ["x"] * (MAX_CLIENT_BATCH + 1))]),
        "INVALID_ARGUMENT",
    ),
    (
        "unknown output",
        lambda m, c: c.infer(CLS, [texts_input(m, "TEXT", ["x"])], outputs=[m.InferRequestedOutput("NOPE")]),
        "INVALID_ARGUMENT",
    ),
    ("no mask", lambda m, c: c.infer(MLM, [texts_input(m, "TEXT", ["no mask"])]), "INVALID_ARGUMENT"),
    (
        "parameter out of range",
        lambda m, c: c.infer(MLM, [texts_input(m, "TEXT", ["a [MASK]"])], parameters={"top_k": 0}),
        "INVALID_ARGUMENT",
    ),
    ("empty text", lambda m, c: c.infer(CLS, [texts_input(m, "TEXT", ["ok", " "])]), "INVALID_ARGUMENT"),
    ("empty batch", lambda m, c: c.infer(CLS, [texts_input(m, "TEXT", [])]), "INVALID_ARGUMENT"),
    (
        "sequence",
        lambda m, c: c.infer(CLS, [texts_input(m, "TEXT", ["x"])], sequence_id=3),
        "INVALID_ARGUMENT",
    ),
    ("deadline", lambda m, c: c.infer(CLS, [texts_input(m, "TEXT", ["x"])], timeout=1), "DEADLINE_EXCEEDED"),
]


@pytest.mark.parametrize(("call", "code"), [c[1:] for c in ERROR_CASES], ids=[c[0] for c in ERROR_CASES])
def test_errors_are_the_http_answers_as_grpc_codes(
    grpc_client: Client, client: triton.InferenceServerClient, call: Call, code: str
) -> None:
    with pytest.raises(InferenceServerException) as over_grpc:
        call(triton_grpc, grpc_client)
    with pytest.raises(InferenceServerException) as over_http:
        call(triton, client)
    assert over_grpc.value.status() == f"StatusCode.{code}", str(over_grpc.value)
    if code != "DEADLINE_EXCEEDED":  # which check saw the deadline pass first (queue, batcher) is a race
        assert over_grpc.value.message() == over_http.value.message()


def test_a_message_over_the_body_limit_is_resource_exhausted(grpc_client: Client) -> None:
    """DISTILSERVE_MAX_BODY_BYTES caps a gRPC message as it caps an HTTP body (413 there)."""
    big = texts_input(triton_grpc, "TEXT", ["x" * (Settings().max_body_bytes + 1)])
    with pytest.raises(InferenceServerException) as caught:
        grpc_client.infer(CLS, [big])
    assert caught.value.status() == "StatusCode.RESOURCE_EXHAUSTED"


def test_domain_errors_map_to_grpc_codes() -> None:
    found = grpc_status(QueueFullError(2.6))
    assert found == (429, grpc.StatusCode.RESOURCE_EXHAUSTED, (("retry-after", "3"),))
    codes = {
        kind.__name__: (found[1] if (found := grpc_status(kind("x"))) else None)
        for kind in (
            InvalidInputError,
            TensorError,
            ModelNotFoundError,
            BatcherClosedError,
            DeadlineExceededError,
            RuntimeError,
        )
    }
    assert codes == {
        "InvalidInputError": grpc.StatusCode.INVALID_ARGUMENT,
        "TensorError": grpc.StatusCode.INVALID_ARGUMENT,
        "ModelNotFoundError": grpc.StatusCode.NOT_FOUND,
        "BatcherClosedError": grpc.StatusCode.UNAVAILABLE,
        "DeadlineExceededError": grpc.StatusCode.DEADLINE_EXCEEDED,
        "RuntimeError": None,
    }
