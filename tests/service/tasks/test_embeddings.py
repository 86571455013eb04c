"""Sentence embeddings served: OpenAI's /v1/embeddings (the official client on a real uvicorn), TEI's /embed
and v2, each answer checked against PyTorch's SentenceEncoder (training.embeddings); bad input is a 4xx."""

from __future__ import annotations

import base64
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest
from fastapi.testclient import TestClient

from service.api.auth import ApiKeyMiddleware
from service.app import create_app
from service.settings import Settings
from tests.export.test_embeddings_export import WINDOW, build_sentence_model, serving_repository
from tests.service.live_server import LiveServer, live_server
from training.embeddings import Pooling

EMBED = "embed"  # mean + normalise, 32 wide (all-MiniLM-L6-v2's rule)
RAW = "embed-raw"  # [CLS] projected to 16, not normalised
CLASSIFIER = "cls"  # another task's model
TEXTS = ["I loved this film, it was wonderful.", "Who founded Acme?", "film"]
LONG = "Acme was founded by John Smith in 1950 in the city of Springfield. " * 10  # past the 32-token window


@pytest.fixture(scope="module")
def built(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """The two embedding models' HF directories and a repository serving them beside a classifier."""
    from tests.tiny_models import build_tiny

    root = tmp_path_factory.mktemp("embeddings-service")
    embedders = {
        EMBED: build_sentence_model(root / EMBED),
        RAW: build_sentence_model(root / RAW, Pooling("cls", normalize=False), projection=16, seed=1),
    }
    classifiers = {CLASSIFIER: build_tiny("text-classification", root / CLASSIFIER)}
    return {**embedders, **classifiers, "repository": serving_repository(root, embedders, classifiers)}


@pytest.fixture(scope="module")
def client(built: dict[str, Path]) -> Iterator[TestClient]:
    with TestClient(create_app(Settings(model_repository=built["repository"]))) as c:
        yield c


@pytest.fixture(scope="module")
def server(built: dict[str, Path]) -> Iterator[LiveServer]:
    with live_server(built["repository"]) as s:
        yield s


def torch_embeddings(model_dir: Path, texts: list[str], normalize: bool | None = None) -> np.ndarray:
    """PyTorch's SentenceEncoder over `texts`, truncated at the served window; `normalize=False`: the
    vector before its normalisation."""
    from transformers import AutoTokenizer

    from training.embeddings import SentenceEncoder, encode

    model = SentenceEncoder.load(model_dir)
    if normalize is not None:
        model.pooling = replace(model.pooling, normalize=normalize)
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    return encode(model, tokenizer, texts, max_length=WINDOW).numpy()


def token_count(model_dir: Path, texts: list[str]) -> int:
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    return sum(len(ids) for ids in tokenizer(texts, truncation=True, max_length=WINDOW)["input_ids"])


def unit(vectors: np.ndarray) -> np.ndarray:
    return vectors / np.linalg.norm(vectors, axis=-1, keepdims=True)


# -- OpenAI's /v1/embeddings ------------------------------------------------------------------------------


def openai_client(server: LiveServer) -> Any:
    from openai import OpenAI

    return OpenAI(base_url=f"{server.base_url}/v1", api_key="unused", max_retries=0)


def test_the_openai_client_gets_pytorchs_embeddings(server: LiveServer, built: dict[str, Path]) -> None:
    client = openai_client(server)
    expected = torch_embeddings(built[EMBED], TEXTS)
    # the client asks for base64 unless told otherwise, and decodes it itself
    answer = client.embeddings.create(model=EMBED, input=TEXTS)
    assert answer.object == "list" and answer.model == EMBED
    assert [d.index for d in answer.data] == [0, 1, 2] and all(d.object == "embedding" for d in answer.data)
    np.testing.assert_allclose(np.array([d.embedding for d in answer.data]), expected, atol=1e-5)
    tokens = token_count(built[EMBED], TEXTS)
    assert answer.usage.prompt_tokens == tokens and answer.usage.total_tokens == tokens

    floats = client.embeddings.create(model=EMBED, input=TEXTS[1], encoding_format="float")
    np.testing.assert_allclose(floats.data[0].embedding, expected[1], atol=1e-5)

    short = client.embeddings.create(model=EMBED, input=TEXTS, dimensions=8)
    np.testing.assert_allclose(np.array([d.embedding for d in short.data]), unit(expected[:, :8]), atol=1e-5)


def test_the_openai_client_reads_bad_requests_and_the_model_list(server: LiveServer) -> None:
    import openai

    client = openai_client(server)
    with pytest.raises(openai.BadRequestError) as too_wide:
        client.embeddings.create(model=EMBED, input="film", dimensions=33)
    assert "have 32" in too_wide.value.message and too_wide.value.param == "dimensions"
    with pytest.raises(openai.BadRequestError) as wrong_task:
        client.embeddings.create(model=CLASSIFIER, input="film")
    assert "not sentence-embeddings" in wrong_task.value.message
    with pytest.raises(openai.NotFoundError):
        client.embeddings.create(model="nope", input="film")
    assert EMBED in {m.id for m in client.models.list()}

    cards = {m["name"]: m for m in httpx.get(f"{server.base_url}/v1/models", timeout=30).json()["models"]}
    assert cards[EMBED]["task"] == "sentence-embeddings"
    assert cards[EMBED]["embedding"]["dimensions"] == 32 and cards[EMBED]["embedding"]["normalized"]
    assert cards[CLASSIFIER]["embedding"] is None


def test_base64_is_the_float_answer_as_little_endian_float32(client: TestClient) -> None:
    floats = client.post("/v1/embeddings", json={"input": TEXTS, "model": EMBED}).json()["data"]
    packed = client.post(
        "/v1/embeddings", json={"input": TEXTS, "model": EMBED, "encoding_format": "base64", "user": "u"}
    ).json()["data"]
    for f, b in zip(floats, packed, strict=True):
        decoded = np.frombuffer(base64.b64decode(b["embedding"]), dtype="<f4")
        assert decoded.tolist() == np.asarray(f["embedding"], dtype=np.float32).tolist()


def test_dimensions_shorten_a_normalised_model_only(client: TestClient, built: dict[str, Path]) -> None:
    full = client.post("/v1/embeddings", json={"input": "film", "model": EMBED}).json()["data"][0][
        "embedding"
    ]
    body = {"input": "film", "model": EMBED, "dimensions": 5}
    short = client.post("/v1/embeddings", json=body).json()["data"][0]["embedding"]
    assert len(short) == 5
    np.testing.assert_allclose(short, unit(np.array(full[:5])), atol=1e-6)
    assert abs(np.linalg.norm(short) - 1) < 1e-6

    same = client.post("/v1/embeddings", json={"input": "film", "model": RAW, "dimensions": 16})
    np.testing.assert_allclose(
        same.json()["data"][0]["embedding"], torch_embeddings(built[RAW], ["film"])[0], atol=1e-5
    )
    refused = client.post("/v1/embeddings", json={"input": "film", "model": RAW, "dimensions": 8})
    assert refused.status_code == 400
    assert (
        refused.json()["error"]["param"] == "dimensions"
        and "not normalised" in refused.json()["error"]["message"]
    )


# -- TEI's /embed -----------------------------------------------------------------------------------------


def test_tei_embed_answers_a_list_of_vectors(client: TestClient, built: dict[str, Path]) -> None:
    one = client.post("/embed", json={"inputs": TEXTS[0]})  # the first embedding model answers
    assert one.status_code == 200
    (vector,) = one.json()  # a single text is a list of one vector, as TEI answers
    np.testing.assert_allclose(vector, torch_embeddings(built[EMBED], TEXTS[:1])[0], atol=1e-5)
    several = client.post("/embed", json={"inputs": TEXTS, "normalize": True, "truncate": False}).json()
    np.testing.assert_allclose(several, torch_embeddings(built[EMBED], TEXTS), atol=1e-5)


def test_tei_normalize_false_is_the_pooled_vector_before_normalisation(
    client: TestClient, built: dict[str, Path]
) -> None:
    pooled = client.post("/embed", json={"inputs": TEXTS, "normalize": False}).json()
    expected = torch_embeddings(built[EMBED], TEXTS, normalize=False)
    np.testing.assert_allclose(pooled, expected, atol=1e-5)
    assert not np.allclose(np.linalg.norm(expected, axis=1), 1.0)

    # a model that does not normalise: as it is with normalize=false, normalised on request
    raw = torch_embeddings(built[RAW], TEXTS)
    as_is = client.post("/embed", json={"inputs": TEXTS, "normalize": False, "model": RAW}).json()
    np.testing.assert_allclose(as_is, raw, atol=1e-5)
    normalised = client.post("/embed", json={"inputs": TEXTS, "model": RAW}).json()
    np.testing.assert_allclose(normalised, unit(raw), atol=1e-5)


def test_tei_refuses_a_text_past_the_window_unless_told_to_truncate(
    client: TestClient, built: dict[str, Path]
) -> None:
    refused = client.post("/embed", json={"inputs": ["film", LONG], "truncate": False})
    assert refused.status_code == 413
    body = refused.json()
    assert body["error_type"] == "validation" and "input 1 is longer than the model's window" in body["error"]

    cut = client.post("/embed", json={"inputs": LONG, "truncate": True})
    assert cut.status_code == 200 and cut.headers["X-Distilserve-Truncated"] == "1"
    np.testing.assert_allclose(cut.json()[0], torch_embeddings(built[EMBED], [LONG])[0], atol=1e-5)
    assert client.post("/embed", json={"inputs": LONG}).status_code == 200  # the server's policy: truncate


# -- v2 ---------------------------------------------------------------------------------------------------


def test_v2_infer_gives_a_batch_of_float32_embeddings(client: TestClient, built: dict[str, Path]) -> None:
    request = {"inputs": [{"name": "TEXT", "datatype": "BYTES", "shape": [3], "data": TEXTS}]}
    reply = client.post(f"/v2/models/{EMBED}/infer", json=request)
    assert reply.status_code == 200, reply.text
    (output,) = reply.json()["outputs"]
    assert output["name"] == "EMBEDDING" and output["datatype"] == "FP32" and output["shape"] == [3, 32]
    got = np.asarray(output["data"], dtype=np.float32).reshape(output["shape"])
    np.testing.assert_allclose(got, torch_embeddings(built[EMBED], TEXTS), atol=1e-5)

    short = client.post(f"/v2/models/{EMBED}/infer", json={**request, "parameters": {"dimensions": 4}})
    assert short.json()["outputs"][0]["shape"] == [3, 4]
    too_wide = client.post(f"/v2/models/{EMBED}/infer", json={**request, "parameters": {"dimensions": 99}})
    assert too_wide.status_code == 400 and "have 32" in too_wide.json()["error"]
    metadata = client.get(f"/v2/models/{EMBED}").json()
    assert metadata["outputs"] == [{"name": "EMBEDDING", "datatype": "FP32", "shape": [-1, -1]}]


# -- bad input --------------------------------------------------------------------------------------------


def test_a_priority_changes_the_queue_not_the_vectors(client: TestClient) -> None:
    plain = client.post("/v1/embeddings", json={"input": TEXTS, "model": EMBED}).json()["data"]
    first = client.post("/v1/embeddings", json={"input": TEXTS, "model": EMBED, "priority": -5}).json()
    assert [d["embedding"] for d in first["data"]] == [d["embedding"] for d in plain]
    tei = client.post("/embed", json={"inputs": TEXTS, "priority": 7})
    assert tei.status_code == 200 and len(tei.json()) == len(TEXTS)
    for path, body in (("/v1/embeddings", {"input": "film"}), ("/embed", {"inputs": "film"})):
        bad = client.post(path, json={**body, "model": EMBED, "priority": 5000})
        assert 400 <= bad.status_code < 500 and "priority" in bad.text


@pytest.mark.parametrize(
    ("body", "message"),
    [
        ({"input": []}, "the list of texts is empty"),
        ({"input": ["film", 3.5]}, "item 1 is float, expected a string"),
        ({"input": "  "}, "the text is empty"),
        ({"input": [101, 2023, 102]}, "token-id inputs are not supported"),
        ({"input": [[101, 102]]}, "token-id inputs are not supported"),
        ({"input": "x" * 100_001}, "at most 100000"),
        ({"input": "film", "dimensions": 0}, "greater than or equal to 1"),
        ({"input": "film", "dimensions": 64}, "have 32"),
        ({"input": "film", "encoding_format": "int8"}, "'float' or 'base64'"),
        ({"input": "film", "model": CLASSIFIER}, "serves text-classification, not sentence-embeddings"),
        ({"input": ["film"] * 10_000}, "items, at most"),
    ],
)
def test_bad_openai_requests_are_400_in_openais_shape(
    client: TestClient, body: dict[str, Any], message: str
) -> None:
    reply = client.post("/v1/embeddings", json={"model": EMBED, **body})
    assert reply.status_code == 400, reply.text
    error = reply.json()["error"]
    assert message in error["message"] and error["type"] == "invalid_request_error"


@pytest.mark.parametrize(
    ("body", "status", "message"),
    [
        ({"inputs": []}, 422, "the list of texts is empty"),
        ({"inputs": ["film", None]}, 422, "item 1 is NoneType, expected a string"),
        ({"inputs": "film", "normalize": "yes"}, 422, "valid boolean"),
        ({"inputs": "film", "prompt_name": "query"}, 422, "prompt_name is not supported"),
        ({"inputs": "film", "truncation_direction": "left"}, 422, "'right' or 'Right'"),
        ({"inputs": "film", "model": CLASSIFIER}, 422, "not sentence-embeddings"),
        ({"inputs": ["film"] * 10_000}, 413, "items, at most"),
    ],
)
def test_bad_tei_requests_are_4xx_in_teis_shape(
    client: TestClient, body: dict[str, Any], status: int, message: str
) -> None:
    reply = client.post("/embed", json=body)
    assert reply.status_code == status, reply.text
    assert message in reply.json()["error"] and reply.json()["error_type"] == "validation"


def test_embed_needs_an_api_key_where_v1_does() -> None:
    async def app(scope: Any, receive: Any, send: Any) -> None:
        raise AssertionError("never called")

    keys = ApiKeyMiddleware(app, ["k"])
    assert keys.protects("/embed") and keys.protects("/v1/embeddings") and not keys.protects("/ready")
