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


def with_probabilities(outputs: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """A batch's outputs with its class probabilities beside the logits.

    Run on the engine thread, once per batch: a softmax per row on the event loop cost ~30 us a request
    (numpy's per-call overhead on a row of two numbers), this costs about that per batch, off the loop.
    """
    return {**outputs, "probabilities": softmax(outputs["logits"].astype(np.float64))}


def top_labels(probabilities: np.ndarray, labels: dict[int, str], top_k: int) -> list[LabelScore]:
    """Best `top_k` labels of one row of probabilities, highest first (ties: lower label id first);
    top_k beyond the labels is clamped."""
    scores: list[float] = probabilities.tolist()
    order = sorted(range(len(scores)), key=scores.__getitem__, reverse=True)[: max(1, top_k)]
    return [LabelScore(label=labels.get(i, f"LABEL_{i}"), score=scores[i]) for i in order]
