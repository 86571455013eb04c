"""SQuAD v1.1 exact match and F1, as the official evaluation script computes them (standard library only)."""

from __future__ import annotations

import re
import string
from collections import Counter
from collections.abc import Sequence
from typing import NamedTuple

_ARTICLES = re.compile(r"\b(a|an|the)\b")
_PUNCTUATION = frozenset(string.punctuation)


class QAScores(NamedTuple):
    """SQuAD v1.1 metrics as fractions in [0, 1] (the official script prints them x100)."""

    exact_match: float
    f1: float


def normalize_answer(text: str) -> str:
    """The official v1.1 normalisation: lowercase, drop punctuation, articles and extra whitespace."""
    text = "".join(ch for ch in text.lower() if ch not in _PUNCTUATION)
    return " ".join(_ARTICLES.sub(" ", text).split())


def exact_match(prediction: str, gold: str) -> float:
    return float(normalize_answer(prediction) == normalize_answer(gold))


def f1(prediction: str, gold: str) -> float:
    """Token-overlap F1 of the normalised strings (bag of words, as in the official script)."""
    predicted, expected = normalize_answer(prediction).split(), normalize_answer(gold).split()
    same = sum((Counter(predicted) & Counter(expected)).values())
    if same == 0:
        return 0.0
    precision, recall = same / len(predicted), same / len(expected)
    return 2 * precision * recall / (precision + recall)


def squad_scores(predictions: Sequence[str], golds: Sequence[Sequence[str]]) -> QAScores:
    """Mean over examples of the best EM and F1 against any gold answer.

    Examples without gold answers cannot be scored and are left out (SQuAD v1.1 always has some).
    """
    if len(predictions) != len(golds):
        raise ValueError(f"{len(predictions)} predictions for {len(golds)} examples")
    scored = [(p, g) for p, g in zip(predictions, golds, strict=True) if g]
    if not scored:
        return QAScores(exact_match=0.0, f1=0.0)
    em = sum(max(exact_match(p, a) for a in g) for p, g in scored)
    overlap = sum(max(f1(p, a) for a in g) for p, g in scored)
    return QAScores(exact_match=em / len(scored), f1=overlap / len(scored))
