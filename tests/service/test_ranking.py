"""The ranking cascade over HTTP: a cross-encoder student ranks every document, and its teacher reads again
those within the margin of the student's best, and only those; orders and scores checked against PyTorch's
logits of both models (conftest's `ranking_pair`: two untrained seeds, so they rank differently)."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from fastapi.testclient import TestClient

from service.app import create_app
from service.settings import Settings
from tests.conftest import RANKING_DOCUMENTS, RANKING_QUERIES, RANKING_WINDOW
from tests.service.tasks.test_cross_encoders import sigmoid, torch_logits
from tests.service.test_app import metric_value
from tests.service.test_cascade import rows_run, with_calibration

QUERY = RANKING_QUERIES[0]


@pytest.fixture(scope="module")
def client(ranking_pair: dict[str, Path]) -> Iterator[TestClient]:
    with TestClient(create_app(Settings(model_repository=ranking_pair["repository"], max_wait_ms=0))) as c:
        yield c


def logits(model_dir: Path, query: str = QUERY) -> np.ndarray:
    return torch_logits(model_dir, [(query, d) for d in RANKING_DOCUMENTS], window=RANKING_WINDOW)


def rerank(client: TestClient, **fields: Any) -> tuple[Any, Any]:
    body = {"model": "ranker", "query": QUERY, "documents": RANKING_DOCUMENTS, **fields}
    reply = client.post("/v1/rerank", json=body)
    assert reply.status_code == 200, reply.text
    return reply.json()["results"], reply.headers


def best_first(scores: np.ndarray, among: list[int]) -> list[int]:
    return sorted(among, key=lambda i: -scores[i])


def test_the_teacher_reads_again_the_documents_near_the_students_best_and_only_those(
    client: TestClient, ranking_pair: dict[str, Path]
) -> None:
    mine, theirs = logits(ranking_pair["student"]), logits(ranking_pair["teacher"])
    gaps = np.sort(mine.max() - mine)
    nearest = next(k for k in (3, 2, 4) if gaps[k] - gaps[k - 1] > 1e-3)  # documents clearly nearest the best
    margin = float(gaps[nearest - 1] + gaps[nearest]) / 2
    near = [i for i in range(len(mine)) if mine.max() - mine[i] <= margin]
    rest = [i for i in range(len(mine)) if i not in near]
    before = rows_run(client, "ranker-teacher"), rows_run(client, "ranker")
    counted = metric_value(client.get("/metrics").text, "distilserve_cascade_fallbacks_total", model="ranker")

    results, headers = rerank(client, cascade_margin=margin)

    assert [r["index"] for r in results] == best_first(theirs, near) + best_first(mine, rest)
    for r in results:
        by_teacher = r["index"] in near
        assert r["model"] == ("ranker-teacher" if by_teacher else "ranker")
        expected = sigmoid((theirs if by_teacher else mine)[r["index"]])
        assert r["relevance_score"] == pytest.approx(expected, abs=1e-5)
    assert headers["x-distilserve-answered-by"] == "ranker, ranker-teacher"
    assert rows_run(client, "ranker-teacher") - before[0] == len(near) == nearest  # those, no more
    assert rows_run(client, "ranker") - before[1] == len(RANKING_DOCUMENTS)
    metrics = client.get("/metrics").text
    assert metric_value(metrics, "distilserve_cascade_fallbacks_total", model="ranker") - counted == len(near)


def test_margin_zero_is_the_students_ranking_and_a_wide_one_the_teachers(
    client: TestClient, ranking_pair: dict[str, Path]
) -> None:
    mine, theirs = logits(ranking_pair["student"]), logits(ranking_pair["teacher"])
    every = list(range(len(RANKING_DOCUMENTS)))
    alone, headers = rerank(client, cascade_margin=0)
    assert [r["index"] for r in alone] == best_first(mine, every)
    assert headers["x-distilserve-answered-by"] == "ranker" and {r["model"] for r in alone} == {"ranker"}
    wide, headers = rerank(client, cascade_margin=1e6, top_n=2)
    assert [r["index"] for r in wide] == best_first(theirs, every)[:2]
    assert headers["x-distilserve-answered-by"] == "ranker-teacher"
    body = {
        "model": "ranker",
        "query": QUERY,
        "texts": RANKING_DOCUMENTS,
        "raw_scores": True,
        "cascade_margin": 1e6,
    }
    tei = client.post("/rerank", json=body).json()  # TEI's shape: the teacher's logits, by the same rule
    np.testing.assert_allclose([r["score"] for r in tei], np.sort(theirs)[::-1], atol=1e-5)


def test_the_calibrated_margin_is_the_default_and_models_describe_it(
    ranking_pair: dict[str, Path], tmp_path: Path
) -> None:
    # as if the student cost a tenth of its teacher and the calibration had read half the documents again:
    # the calibrated cascade pays, so the student ranks first
    fields = {"student_cost": 0.1, "fallback_rate": 0.5}
    repository = with_calibration(ranking_pair["repository"], tmp_path, "ranker", **fields)
    with TestClient(create_app(Settings(model_repository=repository, max_wait_ms=0))) as c:
        card = next(m for m in c.get("/v1/models").json()["models"] if m["name"] == "ranker")
        assert card["teacher"] == {"name": "ranker-teacher", "version": 1}
        cascade = card["cascade"]
        assert cascade["active"] is True and cascade["calibration"]["confidence"] == "score-margin"
        assert cascade["teacher_directly"] is False
        margin = cascade["threshold"]
        assert margin == cascade["calibration"]["threshold"] > 0
        # a query none of whose documents sits at the margin's edge (where float32 and float64 may differ)
        query, mine, theirs = next(
            (q, m, t)
            for q in RANKING_QUERIES
            for m, t in [(logits(ranking_pair["student"], q), logits(ranking_pair["teacher"], q))]
            if np.abs(m.max() - m - margin).min() > 1e-3
        )
        near = [i for i in range(len(mine)) if mine.max() - mine[i] <= margin]
        rest = [i for i in range(len(mine)) if i not in near]
        if len(near) < 2:
            near, rest = [], list(range(len(mine)))
        results, headers = rerank(c, query=query)
        assert [r["index"] for r in results] == best_first(theirs, near) + best_first(mine, rest)
        names = (["ranker"] if rest else []) + (["ranker-teacher"] if near else [])
        assert headers["x-distilserve-answered-by"] == ", ".join(names)


def test_models_say_where_the_student_scored_above_its_teacher(
    ranking_pair: dict[str, Path], tmp_path: Path
) -> None:
    import json
    import shutil

    repository = tmp_path / "models"
    shutil.copytree(ranking_pair["repository"], repository)
    path = repository / "ranker" / "1" / "manifest.json"
    manifest = json.loads(path.read_text())
    manifest["distillation"] = {  # the SQuAD ranker's: taught for a whole pass, its teacher for half of one
        "metric": "accuracy",
        "teacher": {"source": "teacher", "params": 2, "score": 0.9002},
        "student": {"source": "student", "params": 1, "score": 0.9119},
    }
    path.write_text(json.dumps(manifest))
    with TestClient(create_app(Settings(model_repository=repository))) as c:
        card = next(m for m in c.get("/v1/models").json()["models"] if m["name"] == "ranker")
        assert card["cascade"]["student_ahead"] is True
    with TestClient(create_app(Settings(model_repository=ranking_pair["repository"]))) as c:
        card = next(m for m in c.get("/v1/models").json()["models"] if m["name"] == "ranker")
        assert card["cascade"]["student_ahead"] is False  # no distillation record: nothing to say


def test_a_ranking_cascade_dearer_than_its_teacher_leaves_the_student_out(
    ranking_pair: dict[str, Path], tmp_path: Path
) -> None:
    fields = {"student_cost": 0.5, "fallback_rate": 0.8}
    repository = with_calibration(ranking_pair["repository"], tmp_path, "ranker", **fields)
    theirs = logits(ranking_pair["teacher"])
    with TestClient(create_app(Settings(model_repository=repository, max_wait_ms=0))) as c:
        card = next(m for m in c.get("/v1/models").json()["models"] if m["name"] == "ranker")
        assert card["cascade"]["teacher_directly"] is True  # 0.5 + 80 % read again > the teacher alone
        before = rows_run(c, "ranker")
        results, headers = rerank(c)
        assert headers["x-distilserve-answered-by"] == "ranker-teacher"
        assert [r["index"] for r in results] == best_first(theirs, list(range(len(theirs))))
        assert rows_run(c, "ranker") == before  # the student ran nothing
        _, asked = rerank(c, cascade_margin=0)  # a request's own margin runs the student
        assert asked["x-distilserve-answered-by"] == "ranker"


def test_score_and_predict_are_the_named_models_own(
    client: TestClient, ranking_pair: dict[str, Path]
) -> None:
    mine = logits(ranking_pair["student"])
    reply = client.post("/v1/score", json={"model": "ranker", "text_1": QUERY, "text_2": RANKING_DOCUMENTS})
    assert reply.headers["x-distilserve-answered-by"] == "ranker"
    np.testing.assert_allclose([d["score"] for d in reply.json()["data"]], sigmoid(mine), atol=1e-5)
    # a margin between documents is no threshold for one pair's relevance: /predict stays the student's
    predicted = client.post("/predict", json={"model": "ranker", "inputs": [QUERY, RANKING_DOCUMENTS[0]]})
    assert predicted.headers["x-distilserve-answered-by"] == "ranker"
    assert predicted.json()[0]["score"] == pytest.approx(sigmoid(mine[0]), abs=1e-5)


def test_cascade_off_or_naming_the_teacher_ranks_with_one_model(ranking_pair: dict[str, Path]) -> None:
    theirs = logits(ranking_pair["teacher"])
    settings = Settings(model_repository=ranking_pair["repository"], cascade="off")
    with TestClient(create_app(settings)) as c:
        _, headers = rerank(c)
        assert headers["x-distilserve-answered-by"] == "ranker"
        _, headers = rerank(c, cascade_margin=1e6)  # a request's own margin still applies
        assert headers["x-distilserve-answered-by"] == "ranker-teacher"
        named, headers = rerank(c, model="ranker-teacher")
        assert headers["x-distilserve-answered-by"] == "ranker-teacher"
        assert [r["index"] for r in named] == best_first(theirs, list(range(len(theirs))))


def test_a_bad_margin_is_a_4xx_that_names_it(client: TestClient) -> None:
    for margin in (-1, "wide", None):
        body = {"model": "ranker", "query": QUERY, "documents": RANKING_DOCUMENTS, "cascade_margin": margin}
        reply = client.post("/v1/rerank", json=body)
        if margin is None:  # null: the default, as if left out
            assert reply.status_code == 200
            continue
        assert reply.status_code == 400 and "cascade_margin" in reply.text  # OpenAI's routes: a 400


def test_shadow_checks_count_queries_served_the_teachers_best_document(
    ranking_pair: dict[str, Path],
) -> None:
    settings = Settings(model_repository=ranking_pair["repository"], shadow_rate=1.0, max_wait_ms=0)
    expected = 0
    with TestClient(create_app(settings)) as c:
        for query in RANKING_QUERIES:
            _, headers = rerank(c, query=query, cascade_margin=0)  # the student's best is served
            assert headers["x-distilserve-answered-by"] == "ranker"
            mine, theirs = logits(ranking_pair["student"], query), logits(ranking_pair["teacher"], query)
            expected += int(np.argmax(mine) == np.argmax(theirs))

        def counted(name: str) -> float:
            return metric_value(c.get("/metrics").text, name, model="ranker", teacher="ranker-teacher")

        deadline = time.monotonic() + 10
        while (
            counted("distilserve_shadow_compared_total") < len(RANKING_QUERIES)
            and time.monotonic() < deadline
        ):
            time.sleep(0.02)
        assert counted("distilserve_shadow_compared_total") == len(RANKING_QUERIES)
        assert counted("distilserve_shadow_agreed_total") == expected
        assert counted("distilserve_shadow_dropped_total") == 0
        # the alert compares live agreement with the calibration's: queries served the teacher's best
        gauge = metric_value(c.get("/metrics").text, "distilserve_distillation_agreement", model="ranker")
        card = next(m for m in c.get("/v1/models").json()["models"] if m["name"] == "ranker")
        assert gauge == pytest.approx(card["cascade"]["calibration"]["agreement"])
        # a query the teacher already ranked whole agrees by itself, and is still counted
        rerank(c, cascade_margin=1e6)
        deadline = time.monotonic() + 10
        while (
            counted("distilserve_shadow_compared_total") < len(RANKING_QUERIES) + 1
            and time.monotonic() < deadline
        ):
            time.sleep(0.02)
        assert counted("distilserve_shadow_agreed_total") == expected + 1
