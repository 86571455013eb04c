"""Open Inference Protocol v2 as tritonclient speaks it, against a real uvicorn serving one model per task.

Every answer is checked against the /v1 endpoint's answer for the same inputs, on the same server.
"""

from __future__ import annotations

import asyncio
import gzip
import json
import struct
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest
import tritonclient.http as triton
import tritonclient.http.aio as triton_aio
from fastapi.testclient import TestClient
from tritonclient.utils import InferenceServerException

from service.api.v2 import v2_error
from service.api.v2_schemas import InferenceRequest, RequestInput, read_text_inputs
from service.app import create_app
from service.batch_policy import BatcherClosedError, DeadlineExceededError, QueueFullError
from service.settings import Settings
from service.tasks.contract import InvalidInputError
from tests.service.v2.helpers import (
    CLS,
    CONTEXT,
    LM,
    MAX_CLIENT_BATCH,
    MLM,
    QA,
    outputs,
    strings,
    texts_input,
    v1,
)

# -- health and metadata ----------------------------------------------------------------------------------


def test_health_and_server_metadata(client: triton.InferenceServerClient) -> None:
    assert client.is_server_live() and client.is_server_ready()
    metadata = client.get_server_metadata()
    assert metadata["name"] == "distilserve" and "binary_tensor_data" in metadata["extensions"]


def test_model_readiness(client: triton.InferenceServerClient) -> None:
    assert all(client.is_model_ready(name) for name in (CLS, QA, MLM, LM))
    assert client.is_model_ready(CLS, "1")
    assert not client.is_model_ready(CLS, "2") and not client.is_model_ready("no-such-model")


def test_model_metadata_documents_the_text_interface(client: triton.InferenceServerClient) -> None:
    def tensors(metadata: dict[str, Any], kind: str) -> dict[str, tuple[str, list[int]]]:
        return {t["name"]: (t["datatype"], t["shape"]) for t in metadata[kind]}

    cls = client.get_model_metadata(CLS)
    assert (cls["name"], cls["versions"], cls["platform"]) == (CLS, ["1"], "onnxruntime_onnx")
    assert tensors(cls, "inputs") == {"TEXT": ("BYTES", [-1])}
    assert tensors(cls, "outputs") == {
        "LABEL": ("BYTES", [-1]),
        "SCORE": ("FP32", [-1]),
        "SCORES": ("FP32", [-1, 2]),
        "MODEL": ("BYTES", [-1]),  # who answered each text: the student, or its teacher (service.cascade)
    }
    assert client.get_model_metadata(CLS, "1") == cls
    qa = client.get_model_metadata(QA)
    assert list(tensors(qa, "inputs")) == ["QUESTION", "CONTEXT"]
    assert tensors(qa, "outputs")["START"] == ("INT64", [-1])
    assert tensors(client.get_model_metadata(MLM), "outputs")["TOKEN"] == ("INT64", [-1, -1])
    assert list(tensors(client.get_model_metadata(LM), "inputs")) == ["PROMPT"]


# -- the four tasks, binary and JSON, equal to /v1 --------------------------------------------------------


@pytest.mark.parametrize("binary", [True, False], ids=["binary", "json"])
def test_classification_matches_v1(client: triton.InferenceServerClient, base_url: str, binary: bool) -> None:
    texts = ["I loved this film, it was wonderful", "a dull, terrible film"]
    result = client.infer(
        CLS, [texts_input("TEXT", texts, binary)], outputs=outputs(["LABEL", "SCORE", "SCORES"], binary)
    )
    expected = v1(base_url, "/v1/classify", {"inputs": texts, "top_k": 2})
    labels = ["negative", "positive"]  # the manifest's label order
    assert strings(result.as_numpy("LABEL")) == [row[0]["label"] for row in expected]
    assert result.as_numpy("SCORE").tolist() == pytest.approx([row[0]["score"] for row in expected], abs=1e-6)
    scores = result.as_numpy("SCORES")
    assert scores.shape == (2, 2) and scores.dtype == np.float32
    by_label = [{r["label"]: r["score"] for r in row} for row in expected]
    assert scores.tolist() == [pytest.approx([s[label] for label in labels], abs=1e-6) for s in by_label]


@pytest.mark.parametrize("binary", [True, False], ids=["binary", "json"])
def test_qa_matches_v1(client: triton.InferenceServerClient, base_url: str, binary: bool) -> None:
    questions = ["Who founded Acme?", "Where is Springfield?"]
    inputs = [texts_input("QUESTION", questions, binary), texts_input("CONTEXT", [CONTEXT, CONTEXT], binary)]
    result = client.infer(QA, inputs, outputs=outputs(["ANSWER", "SCORE", "START", "END"], binary))
    expected = v1(base_url, "/v1/qa", {"inputs": [{"question": q, "context": CONTEXT} for q in questions]})
    assert strings(result.as_numpy("ANSWER")) == [a["answer"] for a in expected]
    assert result.as_numpy("START").tolist() == [a["start"] for a in expected]
    assert result.as_numpy("END").tolist() == [a["end"] for a in expected]
    assert result.as_numpy("SCORE").tolist() == pytest.approx([a["score"] for a in expected], abs=1e-6)


@pytest.mark.parametrize("binary", [True, False], ids=["binary", "json"])
def test_fill_mask_matches_v1(client: triton.InferenceServerClient, base_url: str, binary: bool) -> None:
    texts = ["I loved this [MASK], it was wonderful.", "A dull [MASK]."]
    names = ["TOKEN_STR", "TOKEN", "SCORE", "SEQUENCE"]
    result = client.infer(
        MLM, [texts_input("TEXT", texts, binary)], outputs=outputs(names, binary), parameters={"top_k": 3}
    )
    expected = [c for row in v1(base_url, "/v1/fill-mask", {"inputs": texts, "top_k": 3}) for c in row]
    assert result.as_numpy("TOKEN").shape == (2, 3)
    assert result.as_numpy("TOKEN").ravel().tolist() == [c["token"] for c in expected]
    assert strings(result.as_numpy("TOKEN_STR")) == [c["token_str"] for c in expected]
    assert strings(result.as_numpy("SEQUENCE")) == [c["sequence"] for c in expected]
    assert result.as_numpy("SCORE").ravel().tolist() == pytest.approx(
        [c["score"] for c in expected], abs=1e-6
    )


@pytest.mark.parametrize("binary", [True, False], ids=["binary", "json"])
def test_generation_matches_v1(client: triton.InferenceServerClient, base_url: str, binary: bool) -> None:
    prompts = ["Acme was founded by", "The film was"]
    result = client.infer(
        LM,
        [texts_input("PROMPT", prompts, binary)],
        outputs=outputs(["TEXT", "TOKENS", "FINISH_REASON"], binary),
        parameters={"max_new_tokens": 6},
    )
    expected = [v1(base_url, "/v1/generate", {"prompt": p, "max_new_tokens": 6}) for p in prompts]
    assert strings(result.as_numpy("TEXT")) == [e["generated_text"] for e in expected]
    assert result.as_numpy("TOKENS").tolist() == [e["tokens"] for e in expected]
    assert strings(result.as_numpy("FINISH_REASON")) == [e["finish_reason"] for e in expected]


# -- output selection, extensions, compression -------------------------------------------------------------


def test_selected_outputs_mix_json_and_binary_and_echo_the_id(client: triton.InferenceServerClient) -> None:
    wanted = [triton.InferRequestedOutput("SCORE", binary_data=False), triton.InferRequestedOutput("LABEL")]
    result = client.infer(
        CLS, [texts_input("TEXT", ["fine", "awful"], False)], outputs=wanted, request_id="r-7"
    )
    response = result.get_response()
    assert response["id"] == "r-7" and (response["model_name"], response["model_version"]) == (CLS, "1")
    assert [o["name"] for o in response["outputs"]] == ["SCORE", "LABEL"]
    assert "data" in response["outputs"][0] and response["outputs"][1]["parameters"]["binary_data_size"] > 0
    assert result.as_numpy("SCORES") is None and len(strings(result.as_numpy("LABEL"))) == 2


def test_classification_extension_names_the_labels(client: triton.InferenceServerClient) -> None:
    wanted = [triton.InferRequestedOutput("SCORES", class_count=1), triton.InferRequestedOutput("LABEL")]
    result = client.infer(CLS, [texts_input("TEXT", ["fine", "awful"])], outputs=wanted)
    top = [s.split(":") for s in strings(result.as_numpy("SCORES"))]
    assert [label for _, _, label in top] == strings(result.as_numpy("LABEL"))
    assert all(0.0 < float(value) <= 1.0 and index in ("0", "1") for value, index, _ in top)


def test_compressed_requests_and_responses(client: triton.InferenceServerClient, base_url: str) -> None:
    texts = [f"Text number {i} with a [MASK] in it." for i in range(MAX_CLIENT_BATCH)]
    inputs = [texts_input("TEXT", texts)]
    plain = client.infer(MLM, inputs, parameters={"top_k": 20})
    for algorithm in ("gzip", "deflate"):
        squeezed = client.infer(
            MLM,
            inputs,
            parameters={"top_k": 20},
            request_compression_algorithm=algorithm,
            response_compression_algorithm=algorithm,
        )
        assert squeezed.as_numpy("TOKEN").tolist() == plain.as_numpy("TOKEN").tolist()
    tensor = {"name": "TEXT", "shape": [MAX_CLIENT_BATCH], "datatype": "BYTES", "data": texts}
    body = {"inputs": [tensor], "parameters": {"top_k": 20}}
    response = httpx.post(
        f"{base_url}/v2/models/{MLM}/infer",
        content=gzip.compress(json.dumps(body).encode()),
        headers={"Content-Encoding": "gzip", "Accept-Encoding": "gzip"},
    )
    assert response.status_code == 200 and response.headers["content-encoding"] == "gzip"
    assert response.json()["outputs"][0]["shape"] == [MAX_CLIENT_BATCH, 20]


def test_the_asyncio_client_too(base_url: str) -> None:
    """tritonclient.http.aio (aiohttp, no automatic decompression) reads the same wire format."""

    async def ask() -> tuple[bool, np.ndarray]:
        client = triton_aio.InferenceServerClient(base_url.removeprefix("http://"))
        try:
            ready = await client.is_model_ready(MLM, "1")
            text = texts_input("TEXT", [f"Text {i} with a [MASK]." for i in range(MAX_CLIENT_BATCH)])
            result = await client.infer(
                MLM, [text], "1", parameters={"top_k": 20}, response_compression_algorithm="gzip"
            )
            return ready, result.as_numpy("TOKEN")
        finally:
            await client.close()

    ready, tokens = asyncio.run(ask())
    assert ready and tokens.shape == (MAX_CLIENT_BATCH, 20)


def test_hand_built_binary_request_and_response(base_url: str) -> None:
    """The wire format itself, without tritonclient: length-prefixed BYTES in, binary FP32 out."""
    elements = ["fine", "ünïcode"]
    raw = b"".join(struct.pack("<I", len(e.encode())) + e.encode() for e in elements)
    tensor = {"name": "TEXT", "shape": [2], "datatype": "BYTES", "parameters": {"binary_data_size": len(raw)}}
    header = json.dumps(
        {"inputs": [tensor], "outputs": [{"name": "SCORE", "parameters": {"binary_data": True}}]}
    )
    response = httpx.post(
        f"{base_url}/v2/models/{CLS}/infer",
        content=header.encode() + raw,
        headers={"Inference-Header-Content-Length": str(len(header))},
    )
    assert response.status_code == 200, response.text
    assert response.headers["content-type"] == "application/octet-stream"
    size = int(response.headers["inference-header-content-length"])
    meta = json.loads(response.content[:size])
    assert meta["outputs"] == [
        {"name": "SCORE", "datatype": "FP32", "shape": [2], "parameters": {"binary_data_size": 8}}
    ]
    scores = np.frombuffer(response.content[size:], dtype="<f4")
    expected = v1(base_url, "/v1/classify", {"inputs": elements})
    assert scores.tolist() == pytest.approx([row[0]["score"] for row in expected], abs=1e-6)


# -- errors -----------------------------------------------------------------------------------------------


def _wrong_datatype() -> list[triton.InferInput]:
    tensor = triton.InferInput("TEXT", [2], "INT64")
    return [tensor.set_data_from_numpy(np.array([1, 2], dtype=np.int64))]


def _shape_mismatch() -> list[triton.InferInput]:
    return [texts_input("TEXT", ["one", "two"]).set_shape([3])]


Call = Callable[[triton.InferenceServerClient], object]
ERROR_CASES: list[tuple[str, Call, str, str]] = [
    ("unknown model", lambda c: c.infer("no-such-model", [texts_input("TEXT", ["x"])]), "404", "not served"),
    ("unknown version", lambda c: c.infer(CLS, [texts_input("TEXT", ["x"])], "7"), "404", "no version 7"),
    ("unknown model metadata", lambda c: c.get_model_metadata("no-such-model"), "404", "not served"),
    ("unknown model config", lambda c: c.get_model_config("no-such-model"), "404", "not served"),
    ("unknown version config", lambda c: c.get_model_config(CLS, "7"), "404", "no version 7"),
    ("unknown model stats", lambda c: c.get_inference_statistics("no-such-model"), "404", "not served"),
    ("unknown version stats", lambda c: c.get_inference_statistics(CLS, "7"), "404", "no version 7"),
    (
        "wrong input name",
        lambda c: c.infer(CLS, [texts_input("TXT", ["x"])]),
        "400",
        "unexpected input 'TXT'",
    ),
    ("wrong datatype", lambda c: c.infer(CLS, _wrong_datatype()), "400", "datatype INT64, expected BYTES"),
    ("shape mismatch", lambda c: c.infer(CLS, _shape_mismatch()), "400", "shape [3] holds 3 elements"),
    ("missing input", lambda c: c.infer(QA, [texts_input("QUESTION", ["Who?"])]), "400", "missing input"),
    (
        "batch over the limit",
        lambda c: c.infer(CLS, [texts_input("TEXT", ["x"] * (MAX_CLIENT_BATCH + 1))]),
        "400",
        f"at most {MAX_CLIENT_BATCH}",
    ),
    (
        "unknown output",
        lambda c: c.infer(CLS, [texts_input("TEXT", ["x"])], outputs=[triton.InferRequestedOutput("NOPE")]),
        "400",
        "unknown output 'NOPE'",
    ),
    ("no mask", lambda c: c.infer(MLM, [texts_input("TEXT", ["no mask"])]), "400", "0 [MASK] tokens"),
    (
        "parameter out of range",
        lambda c: c.infer(MLM, [texts_input("TEXT", ["a [MASK]"])], parameters={"top_k": 0}),
        "400",
        "parameters.top_k",
    ),
    ("empty text", lambda c: c.infer(CLS, [texts_input("TEXT", ["ok", " "])]), "400", "item 1 is an empty"),
    ("deadline", lambda c: c.infer(CLS, [texts_input("TEXT", ["x"])], timeout=1), "504", ""),
]


@pytest.mark.parametrize(
    ("call", "status", "message"), [c[1:] for c in ERROR_CASES], ids=[c[0] for c in ERROR_CASES]
)
def test_errors_reach_tritonclient_in_the_v2_shape(
    client: triton.InferenceServerClient, call: Call, status: str, message: str
) -> None:
    with pytest.raises(InferenceServerException) as caught:
        call(client)
    assert caught.value.status() == status, str(caught.value)
    assert message in (caught.value.message() or ""), str(caught.value)


ONE_TEXT = b'{"inputs": [{"name": "TEXT", "shape": [1], "datatype": "BYTES", "data": ["x"]}]}'


@pytest.mark.parametrize(
    ("content", "headers", "message"),
    [
        (b"{not json", {}, "malformed JSON"),
        (b'{"inputs": []}', {}, "inputs"),
        (
            b'{"inputs": [{"name": "TEXT", "shape": [0], "datatype": "BYTES", "data": []}]}',
            {},
            "batch is empty",
        ),
        (ONE_TEXT + b"xx", {"Inference-Header-Content-Length": str(len(ONE_TEXT))}, "2 bytes of binary"),
        (b"{}", {"Inference-Header-Content-Length": "99"}, "body has 2 bytes"),
        (b"{}", {"Content-Encoding": "br"}, "unsupported Content-Encoding"),
    ],
    ids=["malformed", "no inputs", "empty batch", "unclaimed bytes", "short body", "encoding"],
)
def test_malformed_bodies_are_400(
    base_url: str, content: bytes, headers: dict[str, str], message: str
) -> None:
    response = httpx.post(f"{base_url}/v2/models/{CLS}/infer", content=content, headers=headers)
    assert response.status_code == 400, response.text
    assert message in response.json()["error"]


def _text_tensor(data: bytes) -> bytes:
    return b'{"inputs": [{"name": "TEXT", "shape": [1], "datatype": "BYTES", "data": ' + data + b"}]}"


@pytest.mark.parametrize(
    ("content", "message"),
    [
        (b'{"inputs":' + b"[" * 100_000 + b"]" * 100_000 + b"}", "nests too deeply"),
        (_text_tensor(b"[" * 100_000 + b'"x"' + b"]" * 100_000), "nests too deeply"),
        (_text_tensor(b"[" + b"9" * 5000 + b"]"), "4300 digits"),
    ],
    ids=["deep inputs", "deep data", "huge integer"],
)
def test_unparseable_json_is_400_not_500(base_url: str, content: bytes, message: str) -> None:
    """Bodies json.loads cannot take (too deep, too long a number) are the client's error, not a crash."""
    response = httpx.post(f"{base_url}/v2/models/{CLS}/infer", content=content)
    assert response.status_code == 400, response.text
    assert "inference request" in response.json()["error"] and message in response.json()["error"]


def test_deeply_nested_data_is_read_without_recursion() -> None:
    """Python 3.13's json.loads parses nesting deeper than the recursion limit; such data must still read."""
    data: list[Any] = ["x"]
    for _ in range(10_000):
        data = [data]
    request = InferenceRequest(inputs=[RequestInput(name="TEXT", shape=[1], datatype="BYTES", data=data)])
    assert read_text_inputs(request, b"", ["TEXT"]) == {"TEXT": ["x"]}


@pytest.mark.parametrize("model", [CLS, MLM])
def test_lone_surrogate_text_is_400(base_url: str, model: str) -> None:
    """JSON can escape half a surrogate pair; that is no text a tokenizer can take, so name the element."""
    content = _text_tensor(b'["ok [MASK]", "\\ud800"]').replace(b'"shape": [1]', b'"shape": [2]')
    response = httpx.post(f"{base_url}/v2/models/{model}/infer", content=content)
    assert response.status_code == 400, response.text
    assert "input TEXT[1] is not valid Unicode" in response.json()["error"]


def test_invalid_utf8_binary_text_is_400(base_url: str) -> None:
    """The binary route to the same crash: a surrogate encoded as bytes is not UTF-8, so it is refused."""
    raw = struct.pack("<I", 3) + "\ud800".encode("utf-8", "surrogatepass")
    tensor = {"name": "TEXT", "shape": [1], "datatype": "BYTES", "parameters": {"binary_data_size": len(raw)}}
    header = json.dumps({"inputs": [tensor]}).encode()
    response = httpx.post(
        f"{base_url}/v2/models/{CLS}/infer",
        content=header + raw,
        headers={"Inference-Header-Content-Length": str(len(header))},
    )
    assert response.status_code == 400, response.text
    assert "input TEXT[0] is not valid UTF-8" in response.json()["error"]


@pytest.mark.parametrize("version", ["\u00b2", "\u0661", "abc", "9" * 5000])
def test_versions_are_ascii_digits_only(base_url: str, version: str) -> None:
    """Superscript and Arabic-Indic digits pass str.isdigit but are no version: not found, as "abc"."""
    for suffix in ("", "/ready", "/config", "/stats"):
        path = f"/v2/models/{CLS}/versions/{version}{suffix}"
        response = httpx.get(f"{base_url}{path}")
        assert response.status_code == 404, response.text
        assert f"has no version {version!r}" in response.json()["error"]


def test_domain_errors_map_to_v2_status_codes() -> None:
    overloaded = v2_error(QueueFullError(2.6))
    assert (
        overloaded is not None and overloaded.status_code == 429 and overloaded.headers["retry-after"] == "3"
    )
    assert json.loads(bytes(overloaded.body)) == {"error": "queue is full; retry in 2.6 s"}
    codes = {
        kind.__name__: (r.status_code if (r := v2_error(kind("x"))) else None)
        for kind in (InvalidInputError, BatcherClosedError, DeadlineExceededError, RuntimeError)
    }
    assert codes == {
        "InvalidInputError": 400,
        "BatcherClosedError": 503,
        "DeadlineExceededError": 504,
        "RuntimeError": None,
    }


def test_not_ready_before_start_up(tmp_path: Path) -> None:
    """Without the lifespan nothing is loaded: probes say so in v2's way, metadata answers 503."""
    client = TestClient(create_app(Settings(model_repository=tmp_path)))
    assert client.get("/v2/health/live").status_code == 200
    assert client.get("/v2/health/ready").status_code == 400
    assert client.get(f"/v2/models/{CLS}/ready").status_code == 400
    response = client.get(f"/v2/models/{CLS}")
    assert response.status_code == 503 and "starting" in response.json()["error"]
