"""Traffic capture over HTTP: what a pair's teacher answers is kept, with both answers, as the next student's
training data (DISTILSERVE_CAPTURE_DIR), and only that.

The pairs are conftest's untrained tiny models of two seeds, so the student and its teacher disagree.
"""

from __future__ import annotations

import time
from pathlib import Path

import pytest
from fastapi.testclient import TestClient

from common import capture
from service.app import create_app
from service.runtime import StartupError
from service.settings import Settings
from tests.service.test_app import metric_value
from tests.service.test_cascade import TEXTS, classify, with_calibration
from training.data.loaders import load_classification, load_squad
from training.traffic import traffic_dataset


def captured(directory: Path, student: str) -> list[capture.Captured]:
    return list(capture.read(directory / student))


def test_the_cascades_unsure_inputs_are_kept_with_both_answers(pair_repository: Path, tmp_path: Path) -> None:
    keep = tmp_path / "capture"
    settings = Settings(model_repository=pair_repository, max_wait_ms=0, capture_dir=keep)
    with TestClient(create_app(settings)) as c:
        alone, _ = classify(c, "cls", threshold=0.0)
        teacher, _ = classify(c, "cls-teacher")
        scores = sorted(row[0]["score"] for row in alone)
        threshold = (scores[2] + scores[3]) / 2
        unsure = [i for i, row in enumerate(alone) if row[0]["score"] < threshold]
        classify(c, "cls", threshold=threshold)
        metrics = c.get("/metrics").text
    records = captured(keep, "cls")
    assert [r.input for r in records] == [TEXTS[i] for i in unsure]  # those the teacher answered, no others
    for r, i in zip(records, unsure, strict=True):
        assert r.task == "text-classification" and r.source == "cascade"
        assert (r.teacher.model, r.teacher.version) == ("cls-teacher", 1)
        assert r.teacher.answer == {k: v for k, v in teacher[i][0].items() if k != "model"}
        assert r.student is not None and r.student.answer["label"] == alone[i][0]["label"]
        assert r.agreed == (alone[i][0]["label"] == teacher[i][0]["label"])
    assert metric_value(metrics, "distilserve_capture_records_total", model="cls", source="cascade") == 3
    (file,) = (keep / "cls").iterdir()  # one file for the process and student: <time>-<pid>.jsonl
    assert file.name.endswith(".jsonl")


def test_shadow_checks_and_a_teacher_answering_directly_are_kept_too(
    pair_repository: Path, tmp_path: Path
) -> None:
    keep = tmp_path / "capture"
    settings = Settings(model_repository=pair_repository, shadow_rate=1.0, capture_dir=keep)
    with TestClient(create_app(settings)) as c:
        classify(c, "cls", threshold=0.0)  # the student answers all six; the teacher checks each after
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            done = metric_value(c.get("/metrics").text, "distilserve_shadow_compared_total", model="cls")
            if done == len(TEXTS):
                break
            time.sleep(0.02)
    shadows = captured(keep, "cls")
    assert sorted(str(r.input) for r in shadows) == sorted(TEXTS)
    assert {r.source for r in shadows} == {"shadow"} and all(r.student is not None for r in shadows)

    # calibrated so the cascade would cost more than the teacher alone: the teacher answers everything
    repository = with_calibration(pair_repository, tmp_path, student_cost=0.5)
    direct = tmp_path / "direct"
    with TestClient(create_app(Settings(model_repository=repository, capture_dir=direct))) as c:
        classify(c, "cls")
    records = captured(direct, "cls")
    assert [r.input for r in records] == TEXTS
    assert all(r.source == "teacher" and r.student is None and r.agreed is None for r in records)


def test_qa_spans_are_kept_as_squad_answers_training_reads(pair_repository: Path, tmp_path: Path) -> None:
    keep = tmp_path / "capture"
    context = "Acme was founded by John Smith in 1950 in the city of Springfield."
    questions = ["Who founded Acme?", "When was Acme founded?"]
    body = {"model": "qa", "inputs": [{"question": q, "context": context} for q in questions]}
    with TestClient(create_app(Settings(model_repository=pair_repository, capture_dir=keep))) as c:
        answers = c.post("/v1/qa", json=body | {"cascade_threshold": 1.0}).json()
    records = captured(keep, "qa")
    assert [r.input for r in records] == [(q, context) for q in questions]
    squad = tmp_path / "train.json"
    counts = traffic_dataset("question-answering", [keep], squad)
    assert counts.kept == 2
    examples = load_squad(squad)  # the loader checks every answer against its context
    assert [(e.question, e.answers[0].text) for e in examples] == [
        (q, a["answer"]) for q, a in zip(questions, answers, strict=True)
    ]


def test_captured_classification_trains_with_the_original_data(pair_repository: Path, tmp_path: Path) -> None:
    keep = tmp_path / "capture"
    with TestClient(create_app(Settings(model_repository=pair_repository, capture_dir=keep))) as c:
        teacher, _ = classify(c, "cls-teacher")
        classify(c, "cls", threshold=1.0)  # every input unsure: all six answered by the teacher
    original = tmp_path / "original.jsonl"
    original.write_text(
        '{"text": "a fine film", "label": "positive"}\n{"text": "awful", "label": "negative"}\n'
    )
    out = tmp_path / "train.jsonl"
    counts = traffic_dataset("text-classification", [keep], out, train=original)
    assert (counts.original, counts.kept) == (2, len(TEXTS))
    data = load_classification(out)
    names = data.label_names
    rows = [(e.text, names[e.label]) for e in data.examples]
    assert rows[:2] == [("a fine film", "positive"), ("awful", "negative")]
    assert rows[2:] == [(t, row[0]["label"]) for t, row in zip(TEXTS, teacher, strict=True)]


def test_a_file_at_its_cap_drops_records_and_counts_them(pair_repository: Path, tmp_path: Path) -> None:
    keep = tmp_path / "capture"
    settings = Settings(model_repository=pair_repository, capture_dir=keep, capture_max_mb=400 / 2**20)
    with TestClient(create_app(settings)) as c:
        classify(c, "cls", threshold=1.0)
        deadline = time.monotonic() + 10
        dropped = 0.0
        while time.monotonic() < deadline and dropped == 0:
            dropped = metric_value(c.get("/metrics").text, "distilserve_capture_dropped_total", reason="full")
            time.sleep(0.02)
    (file,) = (keep / "cls").iterdir()
    assert 0 < file.stat().st_size <= 400
    assert len(captured(keep, "cls")) + dropped == len(TEXTS)


def test_a_capture_dir_that_cannot_be_written_stops_start_up(pair_repository: Path, tmp_path: Path) -> None:
    blocker = tmp_path / "not-a-dir"
    blocker.write_text("")
    settings = Settings(model_repository=pair_repository, capture_dir=blocker / "capture")
    with pytest.raises(StartupError, match="DISTILSERVE_CAPTURE_DIR"), TestClient(create_app(settings)):
        pass
