"""Cross-encoders served: a text-classification model of one label reads a query and a document together
(segments A and B) and answers their relevance. TEI's /predict with pairs and /rerank with `texts`, Jina's
and Cohere's /v1/rerank, vLLM's /v1/score and /v1/classify, each checked against PyTorch's logits for the
same pairs (and HF's pipeline rule: one label scores by its sigmoid)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from fastapi.testclient import TestClient

from service.app import create_app
from service.settings import Settings

RANKER = "ranker"  # BERT of one label: a cross-encoder
QUERY = "who founded acme"
DOCUMENTS = ["acme was founded by john smith", "i loved this film", "the founders of acme", "film"]
WINDOW = 32


@pytest.fixture(scope="module")
def built(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    from export.pipeline import export_model
    from tests.tiny_models import build_cross_encoder

    root = tmp_path_factory.mktemp("cross-encoders")
    model_dir = build_cross_encoder(root / RANKER, seed=3)
    repository = root / "models"
    result = export_model(
        model_dir,
        "text-classification",
        RANKER,
        repository,
        ("fp32",),
        max_length=WINDOW,
        require_eval_data=False,
    )
    assert result.version_dir is not None, [(r.variant, r.problems) for r in result.variants]
    return {RANKER: model_dir, "repository": repository}


@pytest.fixture(scope="module")
def client(built: dict[str, Path]) -> Iterator[TestClient]:
    with TestClient(create_app(Settings(model_repository=built["repository"]))) as c:
        yield c


def torch_logits(model_dir: Path, pairs: list[tuple[str, str] | str], window: int = WINDOW) -> np.ndarray:
    """PyTorch's logit for each pair (or text), tokenized as HF tokenizes a pair, cut at the window."""
    import torch
    from transformers import AutoModelForSequenceClassification, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    model = AutoModelForSequenceClassification.from_pretrained(model_dir).eval()
    rows = []
    with torch.no_grad():
        for item in pairs:
            args = (item,) if isinstance(item, str) else item
            encoded = tokenizer(*args, truncation=True, max_length=window, return_tensors="pt")
            rows.append(float(model(**encoded).logits[0, 0]))
    return np.array(rows)


def sigmoid(x: np.ndarray) -> np.ndarray:
    return 1.0 / (1.0 + np.exp(-x))


def post(client: TestClient, path: str, body: dict[str, Any], status: int = 200) -> Any:
    reply = client.post(path, json=body)
    assert reply.status_code == status, reply.text
    return reply.json()


def test_predict_reads_a_pair_as_pytorch_does_and_scores_its_sigmoid(
    client: TestClient, built: dict[str, Path]
) -> None:
    items: list[tuple[str, str] | str] = [(QUERY, DOCUMENTS[0]), DOCUMENTS[1], (QUERY, DOCUMENTS[2])]
    logits = torch_logits(built[RANKER], items)
    batch = [list(i) if isinstance(i, tuple) else [i] for i in items]
    scores = post(client, "/predict", {"inputs": batch})
    assert [row[0]["label"] for row in scores] == ["LABEL_0"] * 3
    np.testing.assert_allclose([row[0]["score"] for row in scores], sigmoid(logits), atol=1e-5)
    raw = post(client, "/predict", {"inputs": [QUERY, DOCUMENTS[0]], "raw_scores": True})  # one pair
    assert raw[0]["score"] == pytest.approx(logits[0], abs=1e-5)
    classified = post(client, "/v1/classify", {"inputs": DOCUMENTS[1]})  # one text: its sigmoid, not 1.0
    assert classified[0]["score"] == pytest.approx(sigmoid(logits[1]), abs=1e-5)


def test_tei_rerank_and_v1_rerank_order_documents_by_pytorchs_relevance(
    client: TestClient, built: dict[str, Path]
) -> None:
    logits = torch_logits(built[RANKER], [(QUERY, d) for d in DOCUMENTS])
    order = np.argsort(-logits, kind="stable").tolist()
    ranks = post(client, "/rerank", {"query": QUERY, "texts": DOCUMENTS, "return_text": True})
    assert [r["index"] for r in ranks] == order  # the only ranking model served: no name needed
    np.testing.assert_allclose([r["score"] for r in ranks], sigmoid(logits[order]), atol=1e-5)
    assert all(r["text"] == DOCUMENTS[r["index"]] for r in ranks)
    raw = post(client, "/rerank", {"query": QUERY, "texts": DOCUMENTS, "raw_scores": True})
    # raw logits up to ~2 in fp32: ONNX and PyTorch sum in other orders, so a share of each value too
    np.testing.assert_allclose([r["score"] for r in raw], logits[order], rtol=1e-5, atol=1e-5)

    cohere = post(client, "/v1/rerank", {"model": RANKER, "query": QUERY, "documents": DOCUMENTS, "top_n": 2})
    assert cohere["model"] == RANKER and [r["index"] for r in cohere["results"]] == order[:2]
    np.testing.assert_allclose(
        [r["relevance_score"] for r in cohere["results"]], sigmoid(logits[order[:2]]), atol=1e-5
    )
    assert cohere["usage"]["total_tokens"] > 0


def test_score_reads_each_pair_once(client: TestClient, built: dict[str, Path]) -> None:
    pairs = [(DOCUMENTS[0], DOCUMENTS[2]), (DOCUMENTS[1], DOCUMENTS[3])]
    by_pair = post(client, "/v1/score", {"text_1": DOCUMENTS[:2], "text_2": DOCUMENTS[2:]})
    np.testing.assert_allclose(
        [d["score"] for d in by_pair["data"]], sigmoid(torch_logits(built[RANKER], pairs)), atol=1e-5
    )
    one_many = post(client, "/v1/score", {"text_1": QUERY, "text_2": DOCUMENTS})
    expected = sigmoid(torch_logits(built[RANKER], [(QUERY, d) for d in DOCUMENTS]))
    np.testing.assert_allclose([d["score"] for d in one_many["data"]], expected, atol=1e-5)


def test_a_long_pair_is_cut_longest_first_or_refused_by_name(
    client: TestClient, built: dict[str, Path]
) -> None:
    long = " ".join(["acme was founded by john smith in springfield"] * 8)
    cut = client.post(
        "/rerank", json={"query": QUERY, "texts": ["film", long], "truncate": True, "raw_scores": True}
    )
    assert cut.status_code == 200 and cut.headers["X-Distilserve-Truncated"] == "1"
    by_index = {r["index"]: r["score"] for r in cut.json()}
    np.testing.assert_allclose(
        [by_index[0], by_index[1]],
        torch_logits(built[RANKER], [(QUERY, "film"), (QUERY, long)]),
        rtol=1e-5,  # raw logits near 2: onnxruntime's and PyTorch's summation orders differ by ~1e-5
        atol=1e-5,
    )
    refused = client.post("/rerank", json={"query": QUERY, "texts": ["film", long], "truncate": False})
    assert refused.status_code == 413
    assert refused.json()["error"].startswith("query with texts[1] is longer than the model's window")


def test_what_a_cross_encoder_cannot_do_is_a_clear_4xx(client: TestClient) -> None:
    body = {"inputs": {"source_sentence": QUERY, "sentences": DOCUMENTS}, "model": RANKER}
    refused = client.post("/similarity", json=body)  # TEI's similarity compares embeddings
    assert refused.status_code == 413 and "needs a sentence-embeddings model" in refused.json()["error"]
    missing = client.post("/similarity", json={"inputs": {"source_sentence": QUERY, "sentences": DOCUMENTS}})
    assert missing.status_code == 404 and "sentence-embeddings" in missing.json()["error"]


def test_tei_info_calls_a_model_of_one_label_a_reranker(client: TestClient) -> None:
    info = client.get("/info").json()
    assert info["model_type"] == {"reranker": {"id2label": {"0": "LABEL_0"}}}
