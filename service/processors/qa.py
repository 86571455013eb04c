"""Question + context -> answer spans, the context split into overlapping windows that batch like texts."""

from __future__ import annotations

from typing import TypedDict

import numpy as np

from service.metrics import Metrics
from service.processors.common import InvalidInputError, check_chars, run_all, tokenizing
from service.runtime import ServedModel
from service.tasks.qa import null_score, offsets_array, span_probabilities, top_spans
from service.tokenization import EncodedText


class Answer(TypedDict):
    answer: str
    score: float
    start: int  # character offsets into the context: context[start:end] == answer
    end: int


def doc_stride(max_length: int, requested: int | None) -> int:
    """Overlap between windows, in tokens; a third of the window unless asked (384 -> 128, as in SQuAD)."""
    return max(1, max_length // 3) if requested is None else requested


def _context_offsets(window: EncodedText) -> list[tuple[int, int] | None]:
    return [o if s == 1 else None for o, s in zip(window.offsets, window.sequence_ids, strict=True)]


def _stack(rows: list[np.ndarray], width: int) -> np.ndarray:
    out = np.zeros((len(rows), width), dtype=np.float64)
    for i, row in enumerate(rows):
        out[i, : row.shape[0]] = row
    return out


async def answer(
    model: ServedModel,
    question: str,
    context: str,
    *,
    top_k: int,
    max_answer_length: int,
    handle_impossible_answer: bool,
    stride: int | None,
    metrics: Metrics,
    timeout_s: float,
) -> list[Answer]:
    check_chars([question], "question")
    check_chars([context], "context")  # no window limit: a long context is split into windows
    stride = doc_stride(model.encoder.max_length, stride)
    with tokenizing(metrics, model):
        try:
            windows = model.encoder.encode_windows(question, context, stride)
        except Exception as e:  # tokenizers: the question leaves no room for the context
            raise InvalidInputError(
                f"question too long for the model's {model.encoder.max_length} tokens ({e})"
            ) from e
    outputs = await run_all(model, windows, timeout_s)
    width = max(len(w) for w in windows)
    start = _stack([o["start_logits"] for o in outputs], width)
    end = _stack([o["end_logits"] for o in outputs], width)
    offsets = offsets_array([_context_offsets(w) for w in windows], width)
    spans = top_spans(start, end, offsets, top_k=top_k, max_answer_length=max_answer_length)
    probabilities = span_probabilities(start, end, offsets, spans, max_answer_length=max_answer_length)
    answers = [
        Answer(answer=context[s.start_char : s.end_char], score=p, start=s.start_char, end=s.end_char)
        for s, p in zip(spans, probabilities, strict=True)
    ]
    if handle_impossible_answer and (not spans or null_score(start, end) > spans[0].score):
        answers.insert(
            0, Answer(answer="", score=1.0 if not spans else _null_probability(start, end), start=0, end=0)
        )
        answers = answers[:top_k]
    return answers


def _null_probability(start: np.ndarray, end: np.ndarray) -> float:
    """P(start = [CLS]) x P(end = [CLS]) in the window where 'no answer' is least likely."""

    def softmax_first(x: np.ndarray) -> np.ndarray:
        e = np.exp(x - x.max(axis=1, keepdims=True))
        return e[:, 0] / e.sum(axis=1)

    return float((softmax_first(start) * softmax_first(end)).min())
