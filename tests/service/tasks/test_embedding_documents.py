"""DISTILSERVE_EMBEDDING_DOCUMENTS=teacher: an embedding student ranks with its teacher's document vectors
(through the passage cache) against its own query vectors, as it would serve queries against an index its
teacher built. Scores checked against PyTorch's SentenceEncoder of both models."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest
from fastapi.testclient import TestClient

from service.app import create_app
from service.settings import Settings
from tests.conftest import EMBEDDING_STUDENT, EMBEDDING_TEACHER
from tests.service.tasks.test_embeddings import torch_embeddings, unit
from tests.service.test_app import metric_value

QUERY = "Who founded Acme?"
QUESTIONS = [QUERY, "Where is Springfield?", "Was the film dull?", "When was Acme founded?", "A city?"]
DOCUMENTS = ["Acme was founded in 1950.", "The film was dull.", "Springfield is a city.", "film"]


@pytest.fixture(scope="module")
def client(embedding_pair: dict[str, Any]) -> Iterator[TestClient]:
    settings = Settings(model_repository=embedding_pair["repository"], embedding_documents="teacher")
    with TestClient(create_app(settings)) as c:
        yield c


def mixed_cosines(pair: dict[str, Any], queries: list[str]) -> np.ndarray:
    """[queries, DOCUMENTS]: the student's query vectors against the teacher's document vectors."""
    mine, theirs = torch_embeddings(pair["student"], queries), torch_embeddings(pair["teacher"], DOCUMENTS)
    return unit(mine) @ unit(theirs).T


def test_rerank_reads_the_students_query_against_the_teachers_documents(
    client: TestClient, embedding_pair: dict[str, Any]
) -> None:
    body = {"query": QUERY, "documents": DOCUMENTS, "model": EMBEDDING_STUDENT, "return_documents": False}
    r = client.post("/v1/rerank", json=body)
    assert r.status_code == 200, r.text
    expected = mixed_cosines(embedding_pair, [QUERY])[0]
    results = r.json()["results"]
    assert [x["index"] for x in results] == list(np.argsort(-expected, kind="stable"))
    for x in results:
        assert x["relevance_score"] == pytest.approx(expected[x["index"]], abs=1e-5)
    assert r.headers["x-distilserve-answered-by"] == f"{EMBEDDING_STUDENT}, {EMBEDDING_TEACHER}"

    def hits(model: str) -> float:
        return metric_value(client.get("/metrics").text, "distilserve_passage_cache_hits_total", model=model)

    before = hits(EMBEDDING_TEACHER)
    assert client.post("/v1/rerank", json=body).json()["results"] == results
    assert hits(EMBEDDING_TEACHER) == before + len(DOCUMENTS)  # the teacher's vectors, from the cache


def test_score_and_similarity_follow_the_same_rule(
    client: TestClient, embedding_pair: dict[str, Any]
) -> None:
    expected = mixed_cosines(embedding_pair, [QUERY])[0]
    body = {"text_1": QUERY, "text_2": DOCUMENTS, "model": EMBEDDING_STUDENT}
    scores = [d["score"] for d in client.post("/v1/score", json=body).json()["data"]]
    np.testing.assert_allclose(scores, expected, atol=1e-5)
    similar = {"inputs": {"source_sentence": QUERY, "sentences": DOCUMENTS}, "model": EMBEDDING_STUDENT}
    np.testing.assert_allclose(client.post("/similarity", json=similar).json(), expected, atol=1e-5)


def test_the_teacher_and_models_without_one_embed_their_own_documents(
    client: TestClient, embedding_pair: dict[str, Any]
) -> None:
    body = {"query": QUERY, "documents": DOCUMENTS, "model": EMBEDDING_TEACHER}
    r = client.post("/v1/rerank", json=body)
    theirs = torch_embeddings(embedding_pair["teacher"], [QUERY, *DOCUMENTS])
    expected = unit(theirs[:1]) @ unit(theirs[1:]).T
    got = {x["index"]: x["relevance_score"] for x in r.json()["results"]}
    np.testing.assert_allclose([got[i] for i in range(len(DOCUMENTS))], expected[0], atol=1e-5)
    assert r.headers["x-distilserve-answered-by"] == EMBEDDING_TEACHER


def documents_by(client: TestClient) -> dict[str, str]:
    return {m["name"]: m["documents_by"] for m in client.get("/v1/models").json()["models"]}


def test_the_model_list_says_who_embeds_each_models_documents(client: TestClient) -> None:
    expected = {EMBEDDING_STUDENT: EMBEDDING_TEACHER, EMBEDDING_TEACHER: EMBEDDING_TEACHER}
    assert documents_by(client) == expected


def test_by_default_the_student_embeds_both(embedding_pair: dict[str, Any]) -> None:
    with TestClient(create_app(Settings(model_repository=embedding_pair["repository"]))) as c:
        body = {"query": QUERY, "documents": DOCUMENTS, "model": EMBEDDING_STUDENT}
        r = c.post("/v1/rerank", json=body)
        assert documents_by(c)[EMBEDDING_STUDENT] == EMBEDDING_STUDENT
    mine = torch_embeddings(embedding_pair["student"], [QUERY, *DOCUMENTS])
    expected = (unit(mine[:1]) @ unit(mine[1:]).T)[0]
    got = {x["index"]: x["relevance_score"] for x in r.json()["results"]}
    np.testing.assert_allclose([got[i] for i in range(len(DOCUMENTS))], expected, atol=1e-5)
    assert r.headers["x-distilserve-answered-by"] == EMBEDDING_STUDENT


def test_retrieve_then_read_picks_passages_by_the_students_question_and_the_teachers_passages(
    embedding_pair: dict[str, Any], tmp_path_factory: pytest.TempPathFactory
) -> None:
    import shutil

    from export.pipeline import export_model
    from tests.tiny_models import build_tiny

    root = tmp_path_factory.mktemp("retrieve-teacher-documents")
    repository = root / "models"
    shutil.copytree(embedding_pair["repository"], repository)
    reader = build_tiny("question-answering", root / "qa")
    assert export_model(reader, "question-answering", "qa", repository, ("fp32",)).version_dir is not None
    settings = Settings(model_repository=repository, embedding_documents="teacher")
    with TestClient(create_app(settings)) as c:
        read, own = [], []
        for question in QUESTIONS:
            body = {"question": question, "passages": DOCUMENTS, "top_k_passages": 1}
            body["embedding_model"] = EMBEDDING_STUDENT
            r = c.post("/v1/qa", json=body)
            assert r.status_code == 200, r.text
            read.append(r.json()["passage"])  # the one passage read
            mine = torch_embeddings(embedding_pair["student"], [question, *DOCUMENTS])
            own.append(int(np.argmax(unit(mine[1:]) @ unit(mine[0]))))
    assert read == [int(i) for i in np.argmax(mixed_cosines(embedding_pair, QUESTIONS), axis=1)]
    assert read != own  # the student alone would have read another passage for some question
