"""Extractive QA: start/end logits of every window -> the best answer spans as characters of the context.

Pure numpy. A span is scored by start logit + end logit (BERT's SQuAD recipe), so windows compare on one
scale; every valid pair is scored (no top-n shortlist that can miss the best valid pair). Ties go to the
first window, the earliest start, then the shortest span, so other implementations can match exactly.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import NamedTuple

import numpy as np
from numpy.lib.stride_tricks import sliding_window_view

NOT_CONTEXT = -1  # offsets value for question, special and padding tokens
MAX_ANSWER_LENGTH = 30  # tokens


class Span(NamedTuple):
    window: int
    start_token: int
    end_token: int  # inclusive
    start_char: int
    end_char: int  # exclusive: context[start_char:end_char] is the answer
    score: float  # start logit + end logit


def offsets_array(
    windows: Sequence[Sequence[tuple[int, int] | None]], length: int | None = None
) -> np.ndarray:
    """[W, L, 2] character offsets of one example's windows; NOT_CONTEXT where a token is not context."""
    width = max((len(w) for w in windows), default=0) if length is None else length
    out = np.full((len(windows), width, 2), NOT_CONTEXT, dtype=np.int64)
    for w, offsets in enumerate(windows):
        for t, offset in enumerate(offsets[:width]):
            if offset is not None:
                out[w, t] = offset
    return out


def _pair_scores(
    start: np.ndarray, end: np.ndarray, offsets: np.ndarray, max_answer_length: int
) -> np.ndarray:
    """scores[w, i, d]: span from token i to i + d of window w; -inf where the span is not valid."""
    in_context = offsets[..., 0] != NOT_CONTEXT
    k = min(max_answer_length, start.shape[1])
    masked_end = np.pad(np.where(in_context, end, -np.inf), ((0, 0), (0, k - 1)), constant_values=-np.inf)
    ends = sliding_window_view(masked_end, k, axis=1)
    return np.where(in_context, start, -np.inf)[:, :, None] + ends


def top_spans(
    start_logits: np.ndarray,
    end_logits: np.ndarray,
    offsets: np.ndarray,
    *,
    top_k: int = 1,
    max_answer_length: int = MAX_ANSWER_LENGTH,
) -> list[Span]:
    """The `top_k` best valid spans over all windows ([W, L] logits, [W, L, 2] offsets), best first."""
    start = np.asarray(start_logits, dtype=np.float64)
    end = np.asarray(end_logits, dtype=np.float64)
    offsets = np.asarray(offsets)
    if start.ndim != 2 or end.shape != start.shape or offsets.shape != (*start.shape, 2):
        raise ValueError(
            f"expected [W, L] logits and [W, L, 2] offsets, got {start.shape}, {end.shape}, {offsets.shape}"
        )
    if max_answer_length < 1:
        raise ValueError(f"max_answer_length must be >= 1, got {max_answer_length}")
    if start.size == 0:
        return []
    scores = _pair_scores(start, end, offsets, max_answer_length)
    flat = scores.ravel()
    spans: list[Span] = []
    for index in np.argsort(-flat, kind="stable")[:top_k]:
        if flat[index] == -np.inf:
            break
        w, i, d = (int(x) for x in np.unravel_index(index, scores.shape))
        spans.append(Span(w, i, i + d, int(offsets[w, i, 0]), int(offsets[w, i + d, 1]), float(flat[index])))
    return spans


def best_span(
    start_logits: np.ndarray,
    end_logits: np.ndarray,
    offsets: np.ndarray,
    *,
    max_answer_length: int = MAX_ANSWER_LENGTH,
) -> Span | None:
    """The single best valid span, or None when no window holds any context."""
    spans = top_spans(start_logits, end_logits, offsets, top_k=1, max_answer_length=max_answer_length)
    return spans[0] if spans else None


def answer_text(context: str, span: Span | None) -> str:
    """The answer as it is written in the context; "" when there is no span."""
    return "" if span is None else context[span.start_char : span.end_char]


def span_probabilities(
    start_logits: np.ndarray,
    end_logits: np.ndarray,
    offsets: np.ndarray,
    spans: Sequence[Span],
    *,
    max_answer_length: int = MAX_ANSWER_LENGTH,
) -> list[float]:
    """Each span's probability among all valid spans of all windows: a softmax over start + end logits.

    Monotone in the span score, so answers ranked by score are also ranked by probability.
    """
    scores = _pair_scores(
        np.asarray(start_logits, dtype=np.float64),
        np.asarray(end_logits, dtype=np.float64),
        offsets,
        max_answer_length,
    )
    valid = scores[np.isfinite(scores)]
    if valid.size == 0:
        return [0.0 for _ in spans]
    peak = valid.max()
    log_total = peak + np.log(np.exp(valid - peak).sum())
    return [float(np.exp(span.score - log_total)) for span in spans]


def null_score(start_logits: np.ndarray, end_logits: np.ndarray) -> float:
    """The 'no answer' score: the [CLS] span; the lowest over windows, as in BERT's SQuAD 2 recipe."""
    return float((np.asarray(start_logits)[:, 0] + np.asarray(end_logits)[:, 0]).min())
