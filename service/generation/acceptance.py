"""The sampling rule of speculative decoding (Leviathan et al. 2023; Chen et al. 2023), as plain functions
of distributions: draft token x, drawn from the draft's distribution q, is kept with probability
min(1, p(x) / q(x)) under the teacher's p; at the first rejection the token is drawn from the residual
max(0, p - q) (normalised) instead; with all k kept, one more is drawn from p. Each emitted token is then
distributed exactly as the teacher's sampler would have drawn it, provided p and q are the full processed
distributions (`distribution`: bias, penalties, a grammar's or min_tokens' mask, temperature, top-k, top-p,
each after the same tokens, drafts included). Greedy: a draft is kept while it is the teacher's argmax.
"""

from __future__ import annotations

from collections.abc import Sequence as Seq

import numpy as np

from service.generation.sampling import SamplingParams, scaled, shaped_scores
from service.generation.sequence import Sequence


def distribution(
    logits: np.ndarray,
    params: SamplingParams,
    prompt: Seq[int],
    output: Seq[int],
    allowed: np.ndarray | None = None,
) -> np.ndarray:
    """The next token's probabilities as `sampling.next_token` draws it after `prompt` and `output` (float64,
    zero outside top-k / top-p and outside what a grammar `allowed`); greedy: all mass on the argmax."""
    scores = shaped_scores(logits, params, prompt, output, allowed)
    out = np.zeros(scores.shape[-1], dtype=np.float64)
    if params.greedy:
        out[int(np.argmax(scores))] = 1.0
        return out
    weights = np.exp(scaled(scores, params.temperature).astype(np.float64))
    order = np.argsort(-weights, kind="stable")
    vocab = len(order)
    keep = params.top_k if 0 < params.top_k < vocab else vocab
    kept = order[:keep]
    if params.top_p < 1.0:
        mass = np.cumsum(weights[kept]) / weights[kept].sum()
        kept = kept[: int(np.searchsorted(mass - weights[kept] / weights[kept].sum(), params.top_p))]
        kept = kept if len(kept) else order[:1]
    out[kept] = weights[kept]
    return out / out.sum()


def allowed_ahead(seq: Sequence, columns: int, ahead: int) -> np.ndarray:
    """A constrained sequence's allowed tokens `ahead` drafted tokens past its output (all of them once its
    min_tokens are out and it has no grammar)."""
    mask = seq.allowed(columns, ahead)
    return np.ones(columns, dtype=bool) if mask is None else mask


def draw(probabilities: np.ndarray, rng: np.random.Generator) -> int:
    cdf = np.cumsum(probabilities)
    return int(min(np.searchsorted(cdf, rng.random() * cdf[-1], side="right"), len(cdf) - 1))


def accept(
    drafts: Seq[int], q: Seq[np.ndarray], p: Seq[np.ndarray], rng: np.random.Generator | None
) -> list[int]:
    """The tokens a step emits: the kept drafts, then one of the teacher's (len(p) == len(drafts) + 1).

    Greedy (no rng): drafts are kept while each is the teacher's argmax; the teacher's argmax follows.
    Sampled: the Leviathan/Chen rule (see the module's docstring)."""
    out: list[int] = []
    for j, token in enumerate(drafts):
        if rng is None:
            best = int(np.argmax(p[j]))
            if token != best:
                return [*out, best]
        else:
            ratio = p[j][token] / q[j][token] if q[j][token] > 0 else 0.0
            if rng.random() >= min(1.0, ratio):
                residual = np.maximum(p[j] - q[j], 0.0)
                total = residual.sum()
                return [*out, draw(residual / total if total > 0 else p[j], rng)]
        out.append(token)
    last = p[len(drafts)]
    return [*out, int(np.argmax(last)) if rng is None else draw(last, rng)]
