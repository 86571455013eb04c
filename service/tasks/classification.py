"""Text classification: class logits -> the top-k `{label, score}` pairs (HF pipeline shape)."""

from __future__ import annotations

from typing import TypedDict

import numpy as np


class LabelScore(TypedDict):
    label: str
    score: float


def softmax(logits: np.ndarray) -> np.ndarray:
    shifted = logits - logits.max(axis=-1, keepdims=True)
    e = np.exp(shifted)
    return e / e.sum(axis=-1, keepdims=True)


def top_labels(logits: np.ndarray, labels: dict[int, str], top_k: int) -> list[LabelScore]:
    """Best `top_k` labels of one row of logits, highest score first; top_k beyond the labels is clamped."""
    scores = softmax(logits.astype(np.float64))
    order = np.argsort(-scores, kind="stable")[: max(1, top_k)]
    return [LabelScore(label=labels.get(int(i), f"LABEL_{int(i)}"), score=float(scores[i])) for i in order]
