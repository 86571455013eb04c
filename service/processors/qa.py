"""Question + context -> answer spans, the context split into overlapping windows that batch like texts."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TypedDict

import numpy as np

from common.spans import null_score, offsets_array, span_probabilities, top_spans
from service.metrics import Metrics
from service.processors.common import InvalidInputError, check_chars, run_all, tokenizing
from service.served import ServedModel
from service.tokenization import EncodedText


class Answer(TypedDict):
    answer: str
    score: float
    start: int  # character offsets into the context: context[start:end] == answer
    end: int


def doc_stride(max_length: int, room: int, requested: int | None) -> int:
    """Overlap between windows, in tokens: a third of the window unless asked (384 -> 128, as in SQuAD).

    At most half the room the question leaves for the context, so each window moves on by at least as
    much as it repeats: an overlap of nearly the whole room would split a context into a window per token
    or two (hundreds of engine calls for a few kilobytes of text)."""
    most = room // 2
    if requested is None:
        return min(max_length // 3, most)
    if requested > most:
        raise InvalidInputError(
            f"doc_stride: {requested} tokens of overlap; beside this question the windows hold {room} "
            f"tokens of context, so at most {most} (half of them)"
        )
    return requested


def _context_offsets(window: EncodedText) -> list[tuple[int, int] | None]:
    return [o if s == 1 else None for o, s in zip(window.offsets, window.sequence_ids, strict=True)]


def _stack(rows: list[np.ndarray], width: int) -> np.ndarray:
    out = np.zeros((len(rows), width), dtype=np.float64)
    for i, row in enumerate(rows):
        out[i, : row.shape[0]] = row
    return out


@dataclass(frozen=True)
class SpanRules:
    """What a request asks of its answers."""

    top_k: int = 1
    max_answer_length: int = 30
    handle_impossible_answer: bool = False
    stride: int | None = None  # window overlap in tokens; None: doc_stride's default


async def answer_all(
    model: ServedModel,
    pairs: Sequence[tuple[str, str]],
    rules: SpanRules,
    metrics: Metrics,
    timeout_s: float,
) -> list[list[Answer]]:
    """The answers to each (question, context) pair. Every pair's windows go to the batcher as one
    request's sequences: queued all or none, and leaving together."""
    windows = [_windows(model, question, context, rules, metrics) for question, context in pairs]
    outputs = await run_all(model, [w for pair in windows for w in pair], timeout_s)
    answers, taken = [], 0
    for (_, context), pair in zip(pairs, windows, strict=True):
        answers.append(_answers(context, pair, outputs[taken : taken + len(pair)], rules))
        taken += len(pair)
    return answers


def _windows(
    model: ServedModel, question: str, context: str, rules: SpanRules, metrics: Metrics
) -> list[EncodedText]:
    check_chars([question], "question")
    check_chars([context], "context")  # no window limit: a long context is split into windows
    with tokenizing(metrics, model):
        room = model.encoder.context_room(question)
        window = model.encoder.max_length
        if room < window // 4:  # else a long context splits into a window per few tokens
            raise InvalidInputError(
                f"the question is too long: beside it the model's window of {window} tokens keeps "
                f"{max(room, 0)} for the context, and the context needs at least {window // 4} (a quarter)"
            )
        windows = model.encoder.encode_windows(question, context, doc_stride(window, room, rules.stride))
    if not any(1 in w.sequence_ids for w in windows):  # e.g. only zero-width spaces or control characters
        raise InvalidInputError("the context has no text the model can read (it tokenizes to nothing)")
    return windows


def _answers(
    context: str, windows: list[EncodedText], outputs: Sequence[dict[str, np.ndarray]], rules: SpanRules
) -> list[Answer]:
    """The best spans over all of a context's windows, best first."""
    width = max(len(w) for w in windows)
    start = _stack([o["start_logits"] for o in outputs], width)
    end = _stack([o["end_logits"] for o in outputs], width)
    offsets = offsets_array([_context_offsets(w) for w in windows], width)
    spans = top_spans(start, end, offsets, top_k=rules.top_k, max_answer_length=rules.max_answer_length)
    probabilities = span_probabilities(start, end, offsets, spans, max_answer_length=rules.max_answer_length)
    answers = [
        Answer(answer=context[s.start_char : s.end_char], score=p, start=s.start_char, end=s.end_char)
        for s, p in zip(spans, probabilities, strict=True)
    ]
    if rules.handle_impossible_answer and (not spans or null_score(start, end) > spans[0].score):
        answers.insert(
            0, Answer(answer="", score=1.0 if not spans else _null_probability(start, end), start=0, end=0)
        )
        answers = answers[: rules.top_k]
    return answers


def _null_probability(start: np.ndarray, end: np.ndarray) -> float:
    """P(start = [CLS]) x P(end = [CLS]) in the window where 'no answer' is least likely."""

    def softmax_first(x: np.ndarray) -> np.ndarray:
        e = np.exp(x - x.max(axis=1, keepdims=True))
        return e[:, 0] / e.sum(axis=1)

    return float((softmax_first(start) * softmax_first(end)).min())
