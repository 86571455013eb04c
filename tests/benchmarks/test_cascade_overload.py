"""benchmarks.cascade_overload's figures, from the replies an open loop got: what clients were answered,
by whom, and how often the teacher's answer."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import typer

from benchmarks.cascade_eval import EvalSet, classification_set
from benchmarks.cascade_overload import (
    mode_env,
    multiples,
    point,
    points_of,
    report,
    request_bodies,
    server_settings,
)
from benchmarks.open_loop import Reply


def answer(label: str, score: float, model: str) -> bytes:
    return json.dumps([{"label": label, "score": score, "model": model}]).encode()


def eval_set(tmp_path: Path) -> EvalSet:
    rows = [{"text": f"text {i}", "label": i % 2} for i in range(4)]
    path = tmp_path / "eval.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    return classification_set(path)


def test_a_point_counts_answers_errors_agreement_and_what_the_busy_teacher_left(
    tmp_path: Path,
) -> None:
    data = eval_set(tmp_path)
    labels = data.gold  # the eval file's label names, in order
    teacher = [labels[0], labels[1], labels[0], labels[1]]  # the teacher's own answers to the four inputs
    replies = [
        Reply(0, 200, answer(labels[0], 0.95, "s"), 0.01),  # sure: the student's, agrees, right
        Reply(1, 200, answer(labels[1], 0.70, "s-teacher"), 0.05),  # sent: the teacher's
        Reply(2, 200, answer(labels[1], 0.60, "s"), 0.02),  # unsure, kept: disagrees, wrong
        Reply(3, 429, b'{"error": "overloaded"}', 0.001),
        Reply(3, 0, b"", 0.5),
    ]
    p = point("student", 1.5, 300.0, replies, data, teacher, "s", threshold=0.8)
    assert p.requests == 5 and p.answered == pytest.approx(3 / 5)
    assert p.statuses == {"429": 1, "0": 1}
    assert p.agreement == pytest.approx(2 / 3) and p.quality == pytest.approx(2 / 3)
    assert p.by_teacher == pytest.approx(1 / 3) and p.kept == pytest.approx(1 / 3)
    line = report([p], 200.0, data, "s", 15).splitlines()[-1]
    assert line.startswith("| student | 1.5x | 300 | 60.0 % | 1x0, 1x429 | 20 | 500 | 66.67 % |")


def test_modes_are_server_settings_and_an_unknown_one_is_refused() -> None:
    assert mode_env("refuse") == {"DISTILSERVE_CASCADE_OVERLOAD": "refuse"}
    assert mode_env("budget:40")["DISTILSERVE_CASCADE_BUDGET_MS"] == "40"
    assert mode_env("split:40") == {"DISTILSERVE_CASCADE_OVERLOAD": "student"}  # the budget is the client's
    with pytest.raises(typer.BadParameter, match="budget:MS"):
        mode_env("sometimes")
    for bad in ("budget:", "split:fast", "budget:-5"):
        with pytest.raises(typer.BadParameter, match="positive number of ms"):
            mode_env(bad)


def test_split_sends_each_input_with_and_without_a_budget_and_reports_each_kind(tmp_path: Path) -> None:
    data = eval_set(tmp_path)
    bodies = [json.loads(b) for b in request_bodies(data, "s", "split:25")]
    assert len(bodies) == 8 and [b["inputs"] for b in bodies[:4]] == [b["inputs"] for b in bodies[4:]]
    assert all("cascade_budget_ms" not in b for b in bodies[:4])
    assert all(b["cascade_budget_ms"] == 25 and "priority" not in b for b in bodies[4:])
    first = [json.loads(b) for b in request_bodies(data, "s", "first:25")]
    assert all("priority" not in b for b in first[:4]) and all(b["priority"] == -1 for b in first[4:])
    labels, teacher = data.gold, data.gold  # a teacher that is always right
    replies = [
        Reply(1, 200, answer(labels[1], 0.6, "s-teacher"), 0.40),  # patient: waited for the teacher
        Reply(5, 200, answer(labels[0], 0.6, "s"), 0.02),  # hurried, same input: the student's stood
    ]
    patient, hurried = points_of("split:25", 2.0, 100.0, replies, data, teacher, "s", threshold=0.8)
    assert (patient.mode, hurried.mode) == ("split:25 none", "split:25 budget")
    assert patient.offered_rps == hurried.offered_rps == 50.0
    assert (patient.agreement, patient.by_teacher, patient.p99_ms) == (1.0, 1.0, pytest.approx(400.0))
    assert (hurried.agreement, hurried.kept, hurried.p99_ms) == (0.0, 1.0, pytest.approx(20.0))


def test_loads_and_settings_that_are_not_what_they_take_are_refused_with_a_message() -> None:
    assert multiples("0.5, 1,2") == [0.5, 1.0, 2.0]
    assert server_settings("DISTILSERVE_MAX_QUEUE=128, A=b=c") == {"DISTILSERVE_MAX_QUEUE": "128", "A": "b=c"}
    for bad in ("", "fast", "1,-2"):
        with pytest.raises(typer.BadParameter, match="positive numbers"):
            multiples(bad)
    with pytest.raises(typer.BadParameter, match="give K=V"):
        server_settings("DISTILSERVE_MAX_QUEUE")
