"""benchmarks/cascade_eval.py: the threshold sweep and the oracle bound on a constructed case."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import pytest

from benchmarks.cascade_eval import EvalSet, Pass, Quality, fewest, oracle, sweep


def _accuracy_set(gold: list[str]) -> EvalSet:
    def accuracy(answers: Sequence[str], expected: Sequence[Any]) -> float:
        return float(np.mean([a == g for a, g in zip(answers, expected, strict=True)]))

    return EvalSet("/v1/classify", list(gold), gold, "accuracy", accuracy, lambda r: r, lambda t: t)


GOLD = ["pos"] * 10
# the student is wrong on inputs 0-2, the teacher on 3 and 9; its least sure inputs are 5, 6, then 0-2
STUDENT = Pass(["neg"] * 3 + ["pos"] * 7, [0.5, 0.55, 0.6, 0.9, 0.9, 0.3, 0.4, 0.9, 0.9, 0.9], ["s"] * 10)
TEACHER = Pass(["pos"] * 3 + ["neg"] + ["pos"] * 5 + ["neg"], [0.9] * 10, ["t"] * 10)


def test_the_oracle_sends_only_the_inputs_the_teacher_gets_right_and_the_student_does_not() -> None:
    bound = oracle(_accuracy_set(GOLD), STUDENT, TEACHER)
    assert [f for f, _ in bound] == pytest.approx([0.0, 0.1, 0.2, 0.3])
    assert [q for _, q in bound] == pytest.approx([0.7, 0.8, 0.9, 1.0])  # the teacher's 0.8 is passed


def test_the_sweep_pays_for_unsure_inputs_the_student_had_right() -> None:
    data = _accuracy_set(GOLD)
    points = sweep(data, STUDENT, TEACHER)
    at = {round(f, 2): q for _, f, q in points}
    assert at[0.0] == pytest.approx(0.7)
    assert at[0.2] == pytest.approx(0.7)  # inputs 5 and 6 sent first: the student had them right
    assert at[0.5] == pytest.approx(1.0)  # then 0-2, which the teacher gets right
    quality = Quality(0.7, 0.0, 0.8, 0.0, 0.0, 0.0, 0.0, {})
    text = fewest(points, oracle(data, STUDENT, TEACHER), quality, data)
    assert "within 0.2 points of the teacher's: 30.0% (threshold 0.5500" in text
    assert "An oracle sending only the inputs the teacher does better on, largest gain first: 10.0%" in text
