"""Rerank, score and similarity on an embedding model: Jina's and Cohere's /v1/rerank, TEI's /rerank and
/similarity, vLLM's /v1/score. Each score is checked against the cosine of PyTorch's embeddings
(training.embeddings), each order against those scores; bad input is a 4xx in the route's shape."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from fastapi.testclient import TestClient

from service.api.auth import ApiKeyMiddleware
from service.app import create_app
from service.settings import Settings
from tests.export.test_embeddings_export import build_sentence_model, serving_repository
from tests.service.live_server import live_server
from tests.service.tasks.test_embeddings import LONG, token_count, torch_embeddings

EMBED = "embed"
CLASSIFIER = "cls"
QUERY = "Who founded Acme?"
DOCUMENTS = [
    "I loved this film, it was wonderful.",
    "Acme was founded by John Smith in 1950.",
    "film",
    "The founders of Acme met in Springfield.",
]


@pytest.fixture(scope="module")
def built(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    from tests.tiny_models import build_tiny

    root = tmp_path_factory.mktemp("similarity-service")
    embed, classifier = (
        build_sentence_model(root / EMBED),
        build_tiny("text-classification", root / CLASSIFIER),
    )
    repository = serving_repository(root, {EMBED: embed}, {CLASSIFIER: classifier})
    return {EMBED: embed, CLASSIFIER: classifier, "repository": repository}


@pytest.fixture(scope="module")
def client(built: dict[str, Path]) -> Iterator[TestClient]:
    with TestClient(create_app(Settings(model_repository=built["repository"]))) as c:
        yield c


def cosines(model_dir: Path, queries: list[str], documents: list[str]) -> np.ndarray:
    """PyTorch's embeddings, compared: [queries, documents]."""
    q, d = torch_embeddings(model_dir, queries), torch_embeddings(model_dir, documents)
    q, d = (v / np.linalg.norm(v, axis=-1, keepdims=True) for v in (q, d))
    return q @ d.T


def test_rerank_ranks_documents_by_pytorchs_cosine_best_first(
    client: TestClient, built: dict[str, Path]
) -> None:
    expected = cosines(built[EMBED], [QUERY], DOCUMENTS)[0]
    documents = [*DOCUMENTS[:2], {"text": DOCUMENTS[2]}, DOCUMENTS[3]]  # Cohere's and Jina's objects too
    reply = client.post("/v1/rerank", json={"model": EMBED, "query": QUERY, "documents": documents})
    assert reply.status_code == 200, reply.text
    body = reply.json()
    assert body["model"] == EMBED and body["id"].startswith("rerank-")
    results = body["results"]
    assert [r["index"] for r in results] == np.argsort(-expected, kind="stable").tolist()
    np.testing.assert_allclose([r["relevance_score"] for r in results], np.sort(expected)[::-1], atol=1e-5)
    assert all(r["document"]["text"] == DOCUMENTS[r["index"]] for r in results)

    top = client.post(
        "/v2/rerank", json={"query": QUERY, "documents": DOCUMENTS, "top_n": 2, "return_documents": False}
    ).json()
    assert [r["index"] for r in top["results"]] == [r["index"] for r in results[:2]]
    assert all("document" not in r for r in top["results"])
    for top_n in (99, 0):  # past the documents, or vLLM's 0: all of them
        every = client.post("/rerank", json={"query": QUERY, "documents": DOCUMENTS, "top_n": top_n}).json()
        assert len(every["results"]) == len(DOCUMENTS)


def test_coheres_official_client_reranks_through_v1_and_v2(built: dict[str, Path]) -> None:
    cohere = pytest.importorskip("cohere")
    expected = cosines(built[EMBED], [QUERY], DOCUMENTS)[0]
    order = np.argsort(-expected, kind="stable").tolist()
    with live_server(built["repository"]) as server:
        v2 = cohere.ClientV2(api_key="unused", base_url=server.base_url)
        ranked = v2.rerank(model=EMBED, query=QUERY, documents=DOCUMENTS, top_n=3)
        assert [r.index for r in ranked.results] == order[:3]
        np.testing.assert_allclose(
            [r.relevance_score for r in ranked.results], expected[order[:3]], atol=1e-5
        )
        v1 = cohere.Client(api_key="unused", base_url=server.base_url)
        every = v1.rerank(model=EMBED, query=QUERY, documents=DOCUMENTS, return_documents=True)
        assert [r.index for r in every.results] == order
        assert [r.document.text for r in every.results] == [DOCUMENTS[i] for i in order]
        with pytest.raises(cohere.core.api_error.ApiError) as refused:
            v2.rerank(model=CLASSIFIER, query=QUERY, documents=DOCUMENTS)
        assert refused.value.status_code == 400 and "ranking needs" in str(refused.value.body)


def test_documents_seen_before_come_from_the_cache_and_cost_no_tokens(
    client: TestClient, built: dict[str, Path]
) -> None:
    documents = ["A text never ranked before.", "Another such text, for the cache."]
    first = client.post("/v1/rerank", json={"query": QUERY, "documents": documents}).json()
    assert first["usage"]["total_tokens"] == token_count(built[EMBED], [QUERY, *documents])
    again = client.post("/v1/rerank", json={"query": QUERY, "documents": documents}).json()
    assert again["usage"]["total_tokens"] == token_count(built[EMBED], [QUERY])
    assert again["results"] == first["results"]


def test_tei_rerank_answers_its_own_list(client: TestClient, built: dict[str, Path]) -> None:
    expected = cosines(built[EMBED], [QUERY], DOCUMENTS)[0]
    ranks = client.post("/rerank", json={"query": QUERY, "texts": DOCUMENTS, "raw_scores": True}).json()
    assert [r["index"] for r in ranks] == np.argsort(-expected, kind="stable").tolist()
    np.testing.assert_allclose([r["score"] for r in ranks], np.sort(expected)[::-1], atol=1e-5)
    assert all(set(r) == {"index", "score", "model"} and r["model"] == EMBED for r in ranks)  # + who scored
    with_text = client.post("/rerank", json={"query": QUERY, "texts": DOCUMENTS, "return_text": True}).json()
    assert all(r["text"] == DOCUMENTS[r["index"]] for r in with_text)


def test_score_pairs_one_against_many_or_pair_by_pair(client: TestClient, built: dict[str, Path]) -> None:
    table = cosines(built[EMBED], DOCUMENTS, DOCUMENTS)
    one_many = client.post("/v1/score", json={"text_1": DOCUMENTS[0], "text_2": DOCUMENTS})
    assert one_many.status_code == 200, one_many.text
    body = one_many.json()
    assert body["object"] == "list" and body["model"] == EMBED and body["id"].startswith("score-")
    assert [d["index"] for d in body["data"]] == [0, 1, 2, 3] and {d["object"] for d in body["data"]} == {
        "score"
    }
    np.testing.assert_allclose([d["score"] for d in body["data"]], table[0], atol=1e-5)
    assert body["data"][0]["score"] == pytest.approx(1.0, abs=1e-5)  # a text with itself

    pairs = client.post("/v1/score", json={"text_1": DOCUMENTS[:2], "text_2": DOCUMENTS[2:]}).json()
    np.testing.assert_allclose([d["score"] for d in pairs["data"]], [table[0, 2], table[1, 3]], atol=1e-5)
    single = client.post("/score", json={"text_1": [DOCUMENTS[1]], "text_2": DOCUMENTS[3]}).json()
    np.testing.assert_allclose([d["score"] for d in single["data"]], [table[1, 3]], atol=1e-5)


def test_tei_similarity_is_the_source_sentences_cosine_with_each(
    client: TestClient, built: dict[str, Path]
) -> None:
    reply = client.post("/similarity", json={"inputs": {"source_sentence": QUERY, "sentences": DOCUMENTS}})
    assert reply.status_code == 200, reply.text
    np.testing.assert_allclose(reply.json(), cosines(built[EMBED], [QUERY], DOCUMENTS)[0], atol=1e-5)


def test_a_text_past_the_window_is_refused_only_when_told_not_to_truncate(client: TestClient) -> None:
    refused = client.post("/rerank", json={"query": QUERY, "texts": ["film", LONG], "truncate": False})
    assert (
        refused.status_code == 413 and "texts[1] is longer than the model's window" in refused.json()["error"]
    )
    query = client.post("/rerank", json={"query": LONG, "texts": ["film"], "truncate": False})
    assert query.status_code == 413 and query.json()["error"].startswith(
        "query is longer than the model's window"
    )
    cut = client.post("/rerank", json={"query": QUERY, "texts": ["film", LONG], "truncate": True})
    assert cut.status_code == 200 and cut.headers["X-Distilserve-Truncated"] == "1"


@pytest.mark.parametrize(
    ("path", "body", "message"),
    [
        ("/v1/rerank", {"query": QUERY}, "documents"),
        ("/v1/rerank", {"query": QUERY, "texts": ["a"]}, "documents"),
        ("/v1/rerank", {"query": " ", "documents": ["a"]}, "query"),
        ("/v1/rerank", {"query": QUERY, "documents": []}, "at least 1 item"),
        ("/v1/rerank", {"query": QUERY, "documents": ["a", ""]}, "documents"),
        ("/v1/rerank", {"query": QUERY, "documents": [{"txt": "a"}]}, "documents"),
        ("/v1/rerank", {"query": QUERY, "documents": ["a"], "top_n": -1}, "greater than or equal to 0"),
        (
            "/v1/rerank",
            {"query": QUERY, "documents": ["a"], "model": CLASSIFIER},
            "(2 labels); ranking needs",
        ),
        ("/v1/rerank", {"query": QUERY, "documents": ["a"] * 10_000}, "items, at most"),
        ("/v1/score", {"text_1": DOCUMENTS[:2], "text_2": DOCUMENTS}, "text_1 has 2 texts and text_2 4"),
        ("/v1/score", {"text_1": [], "text_2": "a"}, "the list of texts is empty"),
        ("/v1/score", {"text_1": "a", "text_2": 3}, "expected a string or a list of strings"),
    ],
)
def test_bad_requests_on_vllms_routes_are_400_in_openais_shape(
    client: TestClient, path: str, body: dict[str, Any], message: str
) -> None:
    reply = client.post(path, json=body)
    assert reply.status_code == 400, reply.text
    error = reply.json()["error"]
    assert message in error["message"] and error["type"] == "invalid_request_error"


@pytest.mark.parametrize(
    ("path", "body", "status", "message"),
    [
        ("/rerank", {"query": QUERY}, 422, "one of `documents` (Jina, Cohere) or `texts` (TEI)"),
        ("/rerank", {"query": QUERY, "documents": ["a"], "texts": ["a"]}, 422, "one of `documents`"),
        ("/rerank", {"query": QUERY, "texts": ["a"] * 10_000}, 413, "items, at most"),
        ("/rerank", {"query": QUERY, "texts": ["a"], "model": "nope"}, 404, "nope"),
        ("/similarity", {"inputs": {"source_sentence": QUERY, "sentences": []}}, 422, "at least 1 item"),
        ("/similarity", {"inputs": {"source_sentence": QUERY}}, 422, "sentences"),
        ("/similarity", {"inputs": QUERY}, 422, "inputs"),
        (
            "/similarity",
            {"inputs": {"source_sentence": "a", "sentences": ["b"]}, "prompt_name": "q"},
            422,
            "prompt_name",
        ),
    ],
)
def test_bad_requests_on_teis_routes_are_4xx_in_its_shape(
    client: TestClient, path: str, body: dict[str, Any], status: int, message: str
) -> None:
    reply = client.post(path, json=body)
    assert reply.status_code == status, reply.text
    assert message in reply.json()["error"]


def test_the_new_routes_need_an_api_key_where_v1_does() -> None:
    async def app(scope: Any, receive: Any, send: Any) -> None:
        raise AssertionError("never called")

    keys = ApiKeyMiddleware(app, ["k"])
    assert all(keys.protects(p) for p in ("/rerank", "/similarity", "/v1/rerank", "/v2/rerank", "/v1/score"))
