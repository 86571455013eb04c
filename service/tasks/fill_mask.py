"""Fill-mask: the vocabulary logits at the mask position -> the top-k tokens with their probabilities."""

from __future__ import annotations

import numpy as np

from service.tasks.classification import softmax


def mask_positions(input_ids: np.ndarray, mask_token_id: int) -> np.ndarray:
    return np.flatnonzero(input_ids == mask_token_id)


def top_tokens(logits: np.ndarray, top_k: int) -> list[tuple[int, float]]:
    """(token id, probability) of the `top_k` most likely tokens of one position, best first."""
    probs = softmax(logits.astype(np.float64))
    k = min(max(1, top_k), probs.shape[-1])
    best = np.argpartition(-probs, k - 1)[:k]
    best = best[np.argsort(-probs[best], kind="stable")]
    return [(int(i), float(probs[i])) for i in best]
