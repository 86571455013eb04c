"""The cascade benchmark's offline half: the eval split as request items with its gold answers and metric,
the answers of one pass over it, and what two passes (student alone, teacher alone) say without serving
anything more: the threshold sweep, the held-out calibration check, the oracle bound and the fewest inputs
sent for a quality within reach of the teacher's (benchmarks/cascade.py serves and measures the rest)."""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from common.cascade import at_threshold, calibrate


@dataclass(frozen=True)
class EvalSet:
    """A task's eval inputs as request items, their gold answers, and how answers are scored."""

    path: str  # the endpoint
    items: list[Any]  # one request item each (a text; a {question, context})
    gold: list[Any]
    quality_name: str
    quality: Callable[[Sequence[str], Sequence[Any]], float]
    read: Callable[[Any], tuple[str, float, str]]  # one answer -> (answer, score, model)
    alone: Callable[[Any], dict[str, Any]]  # one item as a request of its own

    def body(self, items: Sequence[Any], model: str, threshold: float | None) -> dict[str, Any]:
        return _asking({"inputs": list(items)}, model, threshold)

    def one(self, item: Any, model: str, threshold: float | None) -> str:
        return json.dumps(_asking(self.alone(item), model, threshold))


def _asking(body: dict[str, Any], model: str, threshold: float | None) -> dict[str, Any]:
    body = {**body, "model": model}
    return body if threshold is None else {**body, "cascade_threshold": threshold}


def classification_set(path: Path) -> EvalSet:
    from training.data.loaders import load_classification

    data = load_classification(path)

    def accuracy(answers: Sequence[str], gold: Sequence[Any]) -> float:
        return float(np.mean([a == g for a, g in zip(answers, gold, strict=True)]))

    return EvalSet(
        "/v1/classify",
        [e.text for e in data.examples],
        [data.label_names[e.label] for e in data.examples],
        "accuracy",
        accuracy,
        lambda row: (row[0]["label"], row[0]["score"], row[0]["model"]),
        lambda text: {"inputs": text},
    )


def qa_set(path: Path) -> EvalSet:
    from training.data.loaders import load_squad
    from training.squad_metrics import squad_scores

    examples = load_squad(path)
    return EvalSet(
        "/v1/qa",
        [{"question": e.question, "context": e.context} for e in examples],
        [[a.text for a in e.answers] for e in examples],
        "F1",
        lambda answers, gold: squad_scores(answers, gold).f1,
        lambda answer: (answer["answer"], answer["score"], answer["model"]),
        dict,
    )


@dataclass
class Pass:
    """One way of answering the whole eval split."""

    answers: list[str]
    scores: list[float]
    models: list[str]


@dataclass
class Quality:
    student: float
    cascade: float
    teacher: float
    fallback_rate: float
    cascade_agreement: float
    student_agreement: float
    threshold: float
    held_out: dict[str, float]  # calibrated on even rows, measured on odd rows


def held_out(data: EvalSet, student: Pass, teacher: Pass, target: float) -> dict[str, float]:
    """Calibrate on the even rows, apply to the odd ones: the export's figure on inputs it never saw."""
    agrees = np.array([a == b for a, b in zip(student.answers, teacher.answers, strict=True)])
    scores = np.array(student.scores)
    found = calibrate(scores[0::2], agrees[0::2], target)
    odd = range(1, len(scores), 2)
    answers = [student.answers[i] if scores[i] >= found.threshold else teacher.answers[i] for i in odd]
    gold = [data.gold[i] for i in odd]
    on_odd = at_threshold(scores[1::2], agrees[1::2], found.threshold)
    return {
        "threshold": found.threshold,
        "cascade": data.quality(answers, gold),
        "teacher": data.quality([teacher.answers[i] for i in odd], gold),
        "fallback_rate": on_odd.fallback_rate,
        "agreement": on_odd.agreement,
    }


def sweep(data: EvalSet, student: Pass, teacher: Pass) -> list[tuple[float, float, float]]:
    """(threshold, share sent to the teacher, quality) at every distinct student score."""
    points = []
    scores = np.array(student.scores)
    for threshold in [0.0, *sorted(set(student.scores))]:
        answers = [
            s if c >= threshold else t
            for s, t, c in zip(student.answers, teacher.answers, scores, strict=True)
        ]
        points.append((threshold, float((scores < threshold).mean()), data.quality(answers, data.gold)))
    return points


def oracle(data: EvalSet, student: Pass, teacher: Pass) -> list[tuple[float, float]]:
    """(share sent to the teacher, quality) for a cascade that knows each input's gain: it sends only the
    inputs where the teacher's answer scores higher, the largest gains first. No confidence measure does
    better, so this is the bound the student itself sets (the quality is a mean over inputs: accuracy, F1)."""

    def each(answers: list[str]) -> np.ndarray:
        return np.array([data.quality([a], [g]) for a, g in zip(answers, data.gold, strict=True)])

    alone, by_teacher = each(student.answers), each(teacher.answers)
    gains = np.sort(by_teacher - alone)[::-1]
    gains = gains[gains > 0]
    count = len(alone)
    reached = alone.mean() + np.concatenate([[0.0], np.cumsum(gains)]) / count
    return [(sent / count, float(q)) for sent, q in enumerate(reached)]


def fewest(
    points: list[tuple[float, float, float]],
    bound: list[tuple[float, float]],
    quality: Quality,
    data: EvalSet,
) -> str:
    """The least sent to the teacher for a quality within 0.2 and 0.5 points of the teacher's (offline,
    from the student's and teacher's served answers), by threshold and by the oracle."""
    lines = []
    for points_off in (0.2, 0.5):
        floor = quality.teacher - points_off / 100
        within = [p for p in points if p[2] >= floor]
        if within:
            t, f, q = min(within, key=lambda p: p[1])
            lines.append(
                f"Fewest sent to the teacher with {data.quality_name} within {points_off} points of the "
                f"teacher's: {f:.1%} (threshold {t:.4f}, {data.quality_name} {q:.4f})."
            )
        best = next((f for f, q in bound if q >= floor), None)
        if best is not None:
            lines.append(
                f"  An oracle sending only the inputs the teacher does better on, largest gain first: "
                f"{best:.1%} (the least any confidence measure could send with this student)."
            )
    return "\n".join(lines) + "\n"
