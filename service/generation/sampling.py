"""Choosing the next token from logits: greedy, temperature, top-k, top-p, repetition penalty, seeded.

Pure numpy, one sequence at a time (the logits row of one sequence); each sequence owns its generator so a
seeded request gives the same text whatever else shares its batch.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np


@dataclass(frozen=True)
class SamplingParams:
    max_new_tokens: int = 32
    temperature: float = 0.0  # 0: greedy
    top_k: int = 0  # 0: no cut
    top_p: float = 1.0
    repetition_penalty: float = 1.0  # > 1 discourages tokens already in the prompt or the output
    seed: int | None = None
    stop: tuple[str, ...] = field(default_factory=tuple)
    ignore_eos: bool = False  # generate max_new_tokens whatever the model says (fixed-length benchmarks)

    @property
    def greedy(self) -> bool:
        return self.temperature == 0.0


def apply_repetition_penalty(logits: np.ndarray, seen: Sequence[int], penalty: float) -> np.ndarray:
    """CTRL's penalty as in HF: positive logits of seen tokens divided by it, negative ones multiplied."""
    if penalty == 1.0 or not seen:
        return logits
    out = logits.copy()
    ids = np.unique(np.asarray(seen, dtype=np.int64))
    values = out[ids]
    out[ids] = np.where(values > 0, values / penalty, values * penalty)
    return out


def _top_k(logits: np.ndarray, k: int) -> np.ndarray:
    if k <= 0 or k >= logits.shape[-1]:
        return logits
    kth = np.partition(logits, -k)[-k]
    return np.where(logits < kth, -np.inf, logits)


def _top_p(probs: np.ndarray, p: float) -> np.ndarray:
    """Keep the smallest set of most likely tokens whose mass reaches p (the best token always stays)."""
    if p >= 1.0:
        return probs
    order = np.argsort(-probs, kind="stable")
    cumulative = np.cumsum(probs[order])
    keep = cumulative - probs[order] < p
    kept = np.zeros_like(probs)
    kept[order[keep]] = probs[order[keep]]
    return kept / kept.sum()


def next_token(
    logits: np.ndarray, params: SamplingParams, seen: Sequence[int], rng: np.random.Generator | None
) -> int:
    """The next token id for one sequence; `seen` is prompt + output so far (for the repetition penalty)."""
    scores = apply_repetition_penalty(logits.astype(np.float64), seen, params.repetition_penalty)
    if params.greedy or rng is None:
        return int(np.argmax(scores))
    scores = _top_k(scores / params.temperature, params.top_k)
    scores = scores - scores.max()
    probs = np.exp(scores)
    probs = _top_p(probs / probs.sum(), params.top_p)
    return int(rng.choice(probs.shape[-1], p=probs))
