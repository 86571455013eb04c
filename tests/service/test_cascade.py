"""The cascade over HTTP: a student answers, its unsure inputs (and only those) are answered by its teacher.

The pairs are untrained tiny models of two seeds (conftest's `pair_repository`), so the student and the
teacher disagree and every answer says whose it is.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient

from service.app import create_app
from service.settings import Settings
from tests.service.test_app import metric_value

TEXTS = [
    "I loved this film, it was wonderful.",
    "A dull, terrible film.",
    "Acme was founded by John Smith in 1950.",
    "Who founded Acme?",
    "Where is Springfield?",
    "I hated every minute of it.",
]


@pytest.fixture(scope="module")
def client(pair_repository: Path) -> Iterator[TestClient]:
    with TestClient(create_app(Settings(model_repository=pair_repository, max_wait_ms=0))) as c:
        yield c


def classify(client: TestClient, model: str, threshold: float | None = None) -> tuple[list[Any], Any]:
    body: dict[str, Any] = {"inputs": TEXTS, "model": model, "top_k": 2}
    if threshold is not None:
        body["cascade_threshold"] = threshold
    r = client.post("/v1/classify", json=body)
    assert r.status_code == 200, r.text
    return r.json(), r.headers


def rows_run(client: TestClient, model: str) -> float:
    """Sequences the engine has run for `model` (the sum of its batch sizes)."""
    return metric_value(client.get("/metrics").text, "distilserve_batch_size_sum", model=model)


def test_unsure_inputs_and_only_those_are_answered_by_the_teacher(client: TestClient) -> None:
    alone, _ = classify(client, "cls", threshold=0.0)
    teacher, teacher_headers = classify(client, "cls-teacher")
    assert teacher_headers["x-distilserve-answered-by"] == "cls-teacher"
    scores = sorted(row[0]["score"] for row in alone)
    threshold = (scores[2] + scores[3]) / 2  # three inputs below it, three above
    unsure = {i for i, row in enumerate(alone) if row[0]["score"] < threshold}
    assert len(unsure) == 3

    before = rows_run(client, "cls-teacher"), rows_run(client, "cls")
    fallbacks = metric_value(client.get("/metrics").text, "distilserve_cascade_fallbacks_total", model="cls")
    cascaded, headers = classify(client, "cls", threshold=threshold)

    for i, row in enumerate(cascaded):
        expected = teacher[i] if i in unsure else alone[i]
        assert row == expected  # the teacher's own answer, labels and scores, or the student's
        assert {entry["model"] for entry in row} == {"cls-teacher" if i in unsure else "cls"}
    assert headers["x-distilserve-answered-by"] == "cls, cls-teacher"
    after = rows_run(client, "cls-teacher"), rows_run(client, "cls")
    assert after[0] - before[0] == len(unsure)  # the teacher ran the unsure inputs, no more
    assert after[1] - before[1] == len(TEXTS)
    metrics = client.get("/metrics").text
    assert metric_value(metrics, "distilserve_cascade_fallbacks_total", model="cls") - fallbacks == 3
    assert metric_value(metrics, "distilserve_cascade_fallbacks_total", teacher="cls-teacher") >= 3


def test_the_calibrated_threshold_is_the_default_and_zero_keeps_the_student(client: TestClient) -> None:
    # untrained models of two seeds never agree: the calibration sends every input to the teacher
    answered, headers = classify(client, "cls")
    assert headers["x-distilserve-answered-by"] == "cls-teacher"
    assert all(entry["model"] == "cls-teacher" for row in answered for entry in row)
    alone, headers = classify(client, "cls", threshold=0.0)
    assert headers["x-distilserve-answered-by"] == "cls"
    assert all(entry["model"] == "cls" for row in alone for entry in row)


def test_models_lists_each_students_served_teacher_and_its_cascade(client: TestClient) -> None:
    cards = {m["name"]: m for m in client.get("/v1/models").json()["models"]}
    for name in ("cls", "qa", "mlm"):
        card = cards[name]
        assert card["teacher"] == {"name": f"{name}-teacher", "version": 1}
        cascade = card["cascade"]
        assert cascade["active"] is True and cascade["reason"] is None
        assert cascade["threshold"] == cascade["calibration"]["threshold"]
        assert cascade["calibration"]["target_agreement"] == 0.99
        assert cards[f"{name}-teacher"]["teacher"] is None and cards[f"{name}-teacher"]["cascade"] is None


def test_qa_and_fill_mask_hand_unsure_inputs_to_their_teachers(client: TestClient) -> None:
    context = "Acme was founded by John Smith in 1950 in the city of Springfield."
    body = {"model": "qa", "inputs": [{"question": "Who founded Acme?", "context": context}] * 2}
    sure = client.post("/v1/qa", json=body | {"cascade_threshold": 0.0})
    unsure = client.post("/v1/qa", json=body | {"cascade_threshold": 1.0})
    teacher = client.post("/v1/qa", json=body | {"model": "qa-teacher"})
    assert [a["model"] for a in sure.json()] == ["qa", "qa"]
    assert unsure.json() == teacher.json() and [a["model"] for a in teacher.json()] == ["qa-teacher"] * 2
    assert unsure.headers["x-distilserve-answered-by"] == "qa-teacher"
    for a in unsure.json():
        assert context[a["start"] : a["end"]] == a["answer"]

    masked = {"model": "mlm", "inputs": "Acme was [MASK] by John Smith.", "top_k": 3}
    student = client.post("/v1/fill-mask", json=masked | {"cascade_threshold": 0.0}).json()
    fallen = client.post("/v1/fill-mask", json=masked | {"cascade_threshold": 1.0}).json()
    alone = client.post("/v1/fill-mask", json=masked | {"model": "mlm-teacher"}).json()
    assert {c["model"] for c in student} == {"mlm"}
    assert fallen == alone and {c["model"] for c in fallen} == {"mlm-teacher"}


def test_v2_infer_cascades_too_and_checks_the_threshold(client: TestClient) -> None:
    def infer(threshold: float) -> Any:
        return client.post(
            "/v2/models/cls/infer",
            json={
                "inputs": [{"name": "TEXT", "datatype": "BYTES", "shape": [2], "data": TEXTS[:2]}],
                "parameters": {"cascade_threshold": threshold},
            },
        )

    assert infer(0.0).headers["x-distilserve-answered-by"] == "cls"
    assert infer(1.0).headers["x-distilserve-answered-by"] == "cls-teacher"
    bad = infer(2.0)
    assert bad.status_code == 400 and "cascade_threshold" in bad.json()["error"]


def test_a_bad_threshold_is_a_4xx_that_names_it(client: TestClient) -> None:
    r = client.post("/v1/classify", json={"inputs": "fine", "model": "cls", "cascade_threshold": -0.5})
    assert r.status_code == 422 and "cascade_threshold" in r.text


def with_calibration(repository: Path, tmp_path: Path, name: str = "cls", **fields: float) -> Path:
    """The pair repository with these fields of the student's (the classifier's) cascade calibration
    replaced."""
    import json
    import shutil

    copy = tmp_path / "models"
    shutil.copytree(repository, copy)
    path = copy / name / "1" / "manifest.json"
    manifest = json.loads(path.read_text())
    manifest["cascade"].update(fields)
    path.write_text(json.dumps(manifest))
    return copy


def test_a_cascade_dearer_than_its_teacher_leaves_the_student_out(
    pair_repository: Path, tmp_path: Path
) -> None:
    # calibrated to send every input (two seeds' untrained models disagree): 1 + 0.5 > the teacher alone
    repository = with_calibration(pair_repository, tmp_path, student_cost=0.5)
    with TestClient(create_app(Settings(model_repository=repository, max_wait_ms=0))) as c:
        card = next(m for m in c.get("/v1/models").json()["models"] if m["name"] == "cls")
        assert card["cascade"]["active"] is True and card["cascade"]["teacher_directly"] is True
        before = rows_run(c, "cls"), rows_run(c, "cls-teacher")
        answered, headers = classify(c, "cls")
        assert headers["x-distilserve-answered-by"] == "cls-teacher"
        assert answered == classify(c, "cls-teacher")[0]
        assert rows_run(c, "cls") == before[0]  # the student ran nothing
        assert rows_run(c, "cls-teacher") - before[1] == 2 * len(TEXTS)
        metrics = c.get("/metrics").text
        assert metric_value(metrics, "distilserve_cascade_fallbacks_total", model="cls") == len(TEXTS)
        _, asked = classify(c, "cls", threshold=0.0)  # a request's own threshold uses the student
        assert asked["x-distilserve-answered-by"] == "cls"
        assert rows_run(c, "cls") - before[0] == len(TEXTS)


def test_a_cascade_cheaper_than_its_teacher_runs_the_student_first(
    pair_repository: Path, tmp_path: Path
) -> None:
    # as if the calibration had sent half the inputs: 0.4 + 0.5 of the teacher's time per input
    repository = with_calibration(pair_repository, tmp_path, student_cost=0.4, fallback_rate=0.5)
    with TestClient(create_app(Settings(model_repository=repository, max_wait_ms=0))) as c:
        card = next(m for m in c.get("/v1/models").json()["models"] if m["name"] == "cls")
        assert card["cascade"]["teacher_directly"] is False
        before = rows_run(c, "cls")
        _, headers = classify(c, "cls")
        assert headers["x-distilserve-answered-by"] == "cls-teacher"  # every input is unsure
        assert rows_run(c, "cls") - before == len(TEXTS)


def test_cascade_off_serves_students_alone_unless_a_request_asks(pair_repository: Path) -> None:
    settings = Settings(model_repository=pair_repository, cascade="off")
    with TestClient(create_app(settings)) as c:
        alone, headers = classify(c, "cls")
        assert headers["x-distilserve-answered-by"] == "cls"
        assert all(entry["model"] == "cls" for row in alone for entry in row)
        card = next(m for m in c.get("/v1/models").json()["models"] if m["name"] == "cls")
        assert card["cascade"]["active"] is False and "DISTILSERVE_CASCADE=off" in card["cascade"]["reason"]
        _, asked = classify(c, "cls", threshold=1.0)  # a request's own threshold still applies
        assert asked["x-distilserve-answered-by"] == "cls-teacher"


def test_a_student_whose_teacher_is_not_served_answers_alone(pair_repository: Path, tmp_path: Path) -> None:
    import shutil

    repository = tmp_path / "models"
    shutil.copytree(pair_repository / "cls", repository / "cls")  # no cls-teacher beside it
    with TestClient(create_app(Settings(model_repository=repository))) as c:
        answered, headers = classify(c, "cls", threshold=1.0)
        assert headers["x-distilserve-answered-by"] == "cls"
        assert all(entry["model"] == "cls" for row in answered for entry in row)
        (card,) = c.get("/v1/models").json()["models"]
        assert card["teacher"] is None and "not served" in card["cascade"]["reason"]


def test_shadow_checks_count_live_agreement_with_the_teacher(pair_repository: Path) -> None:
    import time

    settings = Settings(model_repository=pair_repository, shadow_rate=1.0)
    with TestClient(create_app(settings)) as c:
        alone, headers = classify(c, "cls", threshold=0.0)  # the student answers all six: all are checked
        assert headers["x-distilserve-answered-by"] == "cls"
        teacher, _ = classify(c, "cls-teacher")
        expected = sum(a[0]["label"] == t[0]["label"] for a, t in zip(alone, teacher, strict=True))

        def counted(name: str) -> float:
            return metric_value(c.get("/metrics").text, name, model="cls", teacher="cls-teacher")

        deadline = time.monotonic() + 10
        while counted("distilserve_shadow_compared_total") < len(TEXTS) and time.monotonic() < deadline:
            time.sleep(0.02)
        assert counted("distilserve_shadow_compared_total") == len(TEXTS)
        assert counted("distilserve_shadow_agreed_total") == expected
        assert counted("distilserve_shadow_dropped_total") == 0
        # what the teacher answered for the client stays the client's: shadows never reach a response
        _, headers = classify(c, "cls")  # calibrated: all to the teacher, nothing left to check
        assert headers["x-distilserve-answered-by"] == "cls-teacher"
        assert counted("distilserve_shadow_compared_total") == len(TEXTS)
