"""text-embeddings-inference's /predict over the tiny classifier pair (conftest's `pair_repository`): every
label of a text, TEI's batch shape, pairs of texts read together, logits on request, the cascade as on
/v1/classify, and TEI's 413 for what its validation refuses. (Pairs against PyTorch: test_cross_encoders.)"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from fastapi.testclient import TestClient

from service.app import create_app
from service.settings import Settings

TEXTS = ["I loved this film, it was wonderful.", "A dull, terrible film."]


@pytest.fixture(scope="module")
def client(pair_repository: Path) -> Iterator[TestClient]:
    with TestClient(create_app(Settings(model_repository=pair_repository, max_wait_ms=0))) as c:
        yield c


def predict(client: TestClient, body: dict[str, Any], status: int = 200) -> Any:
    r = client.post("/predict", json=body)
    assert r.status_code == status, r.text
    return r.json()


def classify(client: TestClient, texts: list[str], model: str, threshold: float | None = None) -> Any:
    body: dict[str, Any] = {"inputs": texts, "model": model, "top_k": 100}
    if threshold is not None:
        body["cascade_threshold"] = threshold
    r = client.post("/v1/classify", json=body)
    assert r.status_code == 200, r.text
    return r.json()


def test_one_text_gets_every_label_best_first_as_v1_classify_ranks_them(client: TestClient) -> None:
    got = predict(client, {"inputs": TEXTS[0], "model": "cls-teacher"})
    assert got == classify(client, TEXTS[:1], "cls-teacher")[0]
    assert [p["score"] for p in got] == sorted((p["score"] for p in got), reverse=True)
    assert sum(p["score"] for p in got) == pytest.approx(1.0)


def test_a_batch_is_a_list_of_one_text_lists_and_gets_a_list_each(client: TestClient) -> None:
    got = predict(client, {"inputs": [[t] for t in TEXTS], "model": "cls-teacher"})
    assert got == classify(client, TEXTS, "cls-teacher")


def test_a_pair_is_read_as_one_sequence_alone_or_in_a_batch_beside_single_texts(client: TestClient) -> None:
    pair = predict(client, {"inputs": TEXTS, "model": "cls-teacher"})  # TEI: a flat list of two is a pair
    assert pair != predict(client, {"inputs": TEXTS[0], "model": "cls-teacher"})
    mixed = predict(client, {"inputs": [[TEXTS[0]], TEXTS, [TEXTS[1]]], "model": "cls-teacher"})
    assert mixed == [
        *classify(client, TEXTS[:1], "cls-teacher"),
        pair,
        *classify(client, TEXTS[1:], "cls-teacher"),
    ]


def test_raw_scores_are_the_logits_behind_the_probabilities(client: TestClient) -> None:
    for text in TEXTS:
        body = {"inputs": text, "model": "cls-teacher"}
        probabilities = {p["label"]: p["score"] for p in predict(client, body)}
        logits = {p["label"]: p["score"] for p in predict(client, {**body, "raw_scores": True})}
        labels = sorted(logits)
        raw = np.array([logits[label] for label in labels], dtype=np.float64)
        softmax = np.exp(raw - raw.max()) / np.exp(raw - raw.max()).sum()
        np.testing.assert_allclose(softmax, [probabilities[label] for label in labels], rtol=1e-5)


def test_a_student_hands_its_unsure_texts_to_its_teacher_as_on_v1_classify(client: TestClient) -> None:
    batch = [[t] for t in TEXTS]
    for threshold, answered_by in ((0.0, "cls"), (1.0, "cls-teacher")):
        r = client.post("/predict", json={"inputs": batch, "model": "cls", "cascade_threshold": threshold})
        assert r.status_code == 200 and r.headers["x-distilserve-answered-by"] == answered_by
        assert r.json() == classify(client, TEXTS, "cls", threshold)
        assert {p["model"] for row in r.json() for p in row} == {answered_by}
    logits = predict(client, {"inputs": batch, "model": "cls", "cascade_threshold": 1.0, "raw_scores": True})
    teacher = predict(client, {"inputs": batch, "model": "cls-teacher", "raw_scores": True})
    assert logits == teacher  # the teacher's logits for the texts it answered


@pytest.mark.parametrize(
    ("body", "status", "message"),
    [
        ({"inputs": ["a", "b", "c"]}, 413, "inputs: 3 texts; a sequence is one text or a pair of two"),
        ({"inputs": [["a text", "another", "a third"]]}, 413, "inputs[0]: 3 texts"),
        ({"inputs": [["ok"], []]}, 413, "inputs[1]: 0 texts"),
        ({"inputs": []}, 413, "the batch is empty"),
        ({"inputs": " "}, 413, "the text is empty"),
        ({"inputs": [["ok"], [""]]}, 413, "inputs[1][0]: the text is empty"),
        ({"inputs": [["ok", " "]]}, 413, "inputs[0][1]: the text is empty"),
        ({"inputs": "word " * 500, "truncate": False}, 413, "truncate: true cuts it"),
        ({"inputs": "a text", "model": "qa"}, 422, "serves question-answering"),
        ({"inputs": 3}, 422, "inputs"),
    ],
)
def test_what_tei_refuses_is_a_clear_4xx(
    client: TestClient, body: dict[str, Any], status: int, message: str
) -> None:
    got = predict(client, {"model": "cls-teacher", **body}, status)
    assert message in got["error"] and got["error_type"] == "validation"


def test_truncate_true_cuts_a_long_text_and_says_so(client: TestClient) -> None:
    r = client.post("/predict", json={"inputs": "word " * 500, "truncate": True, "model": "cls-teacher"})
    assert r.status_code == 200 and r.headers["x-distilserve-truncated"] == "1"
