"""Live agreement for an embedding student: the texts it embeds are embedded again by its teacher, off the
client's path, and each adds its cosine with the teacher's vector; the export-time mean cosine (from the
student's distillation report) is the gauge the drift alert holds the live mean to. Checked against
PyTorch's SentenceEncoder of both models."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest
from fastapi.testclient import TestClient

from service.app import create_app
from service.settings import Settings
from tests.conftest import EMBEDDING_STUDENT, EMBEDDING_TEACHER
from tests.export.test_embeddings_export import build_sentence_model
from tests.service.tasks.test_embeddings import TEXTS, torch_embeddings, unit
from tests.service.test_app import metric_value

STUDENT, TEACHER = EMBEDDING_STUDENT, EMBEDDING_TEACHER
DOCUMENTS = ["Acme was founded in 1950.", "The film was dull.", "Springfield is a city."]


def cosines(first: np.ndarray, second: np.ndarray) -> np.ndarray:
    return np.einsum("ij,ij->i", unit(first), unit(second))


@pytest.fixture(scope="module")
def client(embedding_pair: dict[str, Any]) -> Iterator[TestClient]:
    settings = Settings(model_repository=embedding_pair["repository"], shadow_rate=1.0)
    with TestClient(create_app(settings)) as c:
        yield c


def card(client: TestClient) -> dict[str, Any]:
    """The student's entry in GET /v1/models."""
    (found,) = [m for m in client.get("/v1/models").json()["models"] if m["name"] == STUDENT]
    return found


def counted(client: TestClient, name: str) -> float:
    return metric_value(client.get("/metrics").text, name, model=STUDENT, teacher=TEACHER)


def checked(client: TestClient, at_least: float) -> float:
    """The compared count once the checks in flight have reached it (they run after the answer)."""
    deadline = time.monotonic() + 10
    while counted(client, "distilserve_shadow_compared_total") < at_least and time.monotonic() < deadline:
        time.sleep(0.02)
    return counted(client, "distilserve_shadow_compared_total")


def test_the_export_records_the_mean_cosine_and_the_service_holds_live_agreement_to_it(
    client: TestClient, embedding_pair: dict[str, Any]
) -> None:
    manifest = json.loads((embedding_pair["repository"] / STUDENT / "1" / "manifest.json").read_text())
    assert manifest["distillation"]["teacher_cosine"] == pytest.approx(embedding_pair["mean"])
    gauge = metric_value(client.get("/metrics").text, "distilserve_distillation_agreement", model=STUDENT)
    assert gauge == pytest.approx(embedding_pair["mean"])  # not the report's retrieval agreement (0.5)
    assert card(client)["teacher"] == {"name": TEACHER, "version": 1}


def test_each_embedded_text_adds_its_cosine_with_the_teachers_vector(
    client: TestClient, embedding_pair: dict[str, Any]
) -> None:
    before = checked(client, 0)
    agreed = counted(client, "distilserve_shadow_agreed_total")
    r = client.post("/v1/embeddings", json={"input": TEXTS, "model": STUDENT})
    assert r.status_code == 200, r.text
    served = np.array([row["embedding"] for row in r.json()["data"]])
    mine = torch_embeddings(embedding_pair["student"], TEXTS)
    theirs = torch_embeddings(embedding_pair["teacher"], TEXTS)
    np.testing.assert_allclose(served, mine, atol=1e-5)  # the client has the student's vectors
    assert r.json()["model"] == STUDENT and r.headers["x-distilserve-answered-by"] == STUDENT
    assert checked(client, before + len(TEXTS)) == before + len(TEXTS)
    live = counted(client, "distilserve_shadow_agreed_total") - agreed
    assert live == pytest.approx(float(cosines(mine, theirs).sum()), abs=1e-4)
    assert counted(client, "distilserve_shadow_dropped_total") == 0


def test_tei_embed_and_v2_are_checked_too(client: TestClient) -> None:
    before = checked(client, 0)
    assert client.post("/embed", json={"inputs": TEXTS[:2], "model": STUDENT}).status_code == 200
    assert checked(client, before + 2) == before + 2
    body = {"inputs": [{"name": "TEXT", "shape": [1], "datatype": "BYTES", "data": [TEXTS[2]]}]}
    assert client.post(f"/v2/models/{STUDENT}/infer", json=body).status_code == 200
    assert checked(client, before + 3) == before + 3


def test_rerank_checks_what_it_embeds_and_not_what_the_passage_cache_holds(client: TestClient) -> None:
    before = checked(client, 0)
    query = {"query": "Who founded Acme?", "documents": DOCUMENTS, "model": STUDENT}
    assert client.post("/v1/rerank", json=query).status_code == 200
    assert checked(client, before + 1 + len(DOCUMENTS)) == before + 1 + len(DOCUMENTS)
    assert client.post("/v1/rerank", json=query).status_code == 200  # documents cached: the query alone
    assert checked(client, before + 2 + len(DOCUMENTS)) == before + 2 + len(DOCUMENTS)


def test_the_teacher_named_or_shadow_rate_zero_checks_nothing(embedding_pair: dict[str, Any]) -> None:
    with TestClient(create_app(Settings(model_repository=embedding_pair["repository"]))) as c:
        assert c.post("/v1/embeddings", json={"input": TEXTS, "model": STUDENT}).status_code == 200
        assert counted(c, "distilserve_shadow_compared_total") == 0
    shadowed = Settings(model_repository=embedding_pair["repository"], shadow_rate=1.0)
    with TestClient(create_app(shadowed)) as c:
        assert c.post("/v1/embeddings", json={"input": TEXTS, "model": TEACHER}).status_code == 200
        time.sleep(0.2)
        assert counted(c, "distilserve_shadow_compared_total") == 0


def test_a_teacher_of_another_width_is_no_pair(embedding_pair: dict[str, Any]) -> None:
    from export.pipeline import PairSpec, export_model
    from service.manifest import TeacherRef

    root = embedding_pair["root"]
    narrow = build_sentence_model(root / "narrow", projection=16, seed=2)
    repository = root / "widths"
    sentences = root / "eval.txt"
    export_model(embedding_pair["teacher"], "sentence-embeddings", TEACHER, repository, eval_data=sentences)
    spec = PairSpec(TeacherRef(name=TEACHER, version=1), embedding_pair["teacher"])
    export_model(narrow, "sentence-embeddings", STUDENT, repository, eval_data=sentences, pair=spec)
    with TestClient(create_app(Settings(model_repository=repository, shadow_rate=1.0))) as c:
        found = card(c)
        assert found["teacher"] is None and "its own 16" in found["cascade"]["reason"]
        assert c.post("/v1/embeddings", json={"input": TEXTS, "model": STUDENT}).status_code == 200
        time.sleep(0.2)
        assert counted(c, "distilserve_shadow_compared_total") == 0
