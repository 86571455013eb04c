"""A student/teacher pair's cascade threshold, calibrated on the eval split (common.cascade).

Both PyTorch models answer the same eval inputs as the service would answer them (the top label; the best
span of the context, scored as the service scores it; the top token at the one mask) and the student's
confidence is the score of its best answer, exactly what the service compares with the threshold.
Inputs are read with each model's own tokenizer, so a pair need not share one. A cross-encoder pair (one
label) is calibrated as a ranking instead: the pair file's (query, document) rows grouped by query, each
document's relevance logit from both models, and the margin of common.cascade's ranking cascade.
"""

from __future__ import annotations

import itertools
import time
from collections.abc import Callable, Hashable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import numpy as np

from common.cascade import Calibration, calibrate, calibrate_margin, paying_limit, paying_margin
from common.spans import NOT_CONTEXT, span_probabilities, top_spans
from export.tasks import SPECS, eval_texts, first_mask_positions
from service.manifest import CascadeCalibration, PayingLimit

CASCADE_TASKS = ("text-classification", "question-answering", "fill-mask")
CALIBRATION_EXAMPLES = 2000
MASK = "\x00mask\x00"  # where a fill-mask input's mask goes, before each model's own mask token replaces it
BATCH = 32


@dataclass(frozen=True)
class Answers:
    """One model's best answer to each input, and its score (the confidence the cascade reads)."""

    best: list[Hashable]
    confidence: np.ndarray
    seconds: float = 0.0  # the model's time over all inputs, warmed up


def masked_inputs(lines: Sequence[str], seed: int = 0, first_words: int = 32) -> list[str]:
    """Eval lines with one word (of their first `first_words`) replaced by MASK: what a fill-mask client
    sends. Lines of fewer than three words are left out."""
    rng = np.random.default_rng(seed)
    out = []
    for line in lines:
        words = line.split()
        if len(words) < 3:
            continue
        words[int(rng.integers(0, min(len(words), first_words)))] = MASK
        out.append(" ".join(words))
    return out


def calibration_inputs(task: str, eval_data: Path, limit: int) -> list[Any]:
    """The eval inputs the pair is calibrated on, in the task's shape."""
    texts = eval_texts(SPECS[task], eval_data, limit)
    return masked_inputs(texts) if task == "fill-mask" else list(texts)  # type: ignore[arg-type]


def _softmax(logits: np.ndarray) -> np.ndarray:
    e = np.exp(logits - logits.max(axis=-1, keepdims=True))
    return e / e.sum(axis=-1, keepdims=True)


def answers(model: Any, tokenizer: Any, task: str, inputs: Sequence[Any], max_length: int) -> Answers:
    """The model's best answer to each input and its score, in batches of BATCH."""
    import torch

    best: list[Hashable] = []
    scores: list[float] = []
    with torch.no_grad():
        _ANSWERS[task](model, tokenizer, inputs[:BATCH], max_length)  # warm-up, untimed
    started = time.perf_counter()
    for start in range(0, len(inputs), BATCH):
        chunk = inputs[start : start + BATCH]
        with torch.no_grad():
            part = _ANSWERS[task](model, tokenizer, chunk, max_length)
        best += part.best
        scores += part.confidence.tolist()
    return Answers(best, np.asarray(scores, dtype=np.float64), time.perf_counter() - started)


def _classification(
    model: Any, tokenizer: Any, texts: Sequence[str] | Sequence[tuple[str, str]], max_length: int
) -> Answers:
    pairs = bool(texts) and isinstance(texts[0], tuple)
    inputs = [list(side) for side in zip(*texts, strict=True)] if pairs else [list(texts)]
    encoded = tokenizer(*inputs, truncation=True, max_length=max_length, padding=True, return_tensors="pt")
    probabilities = _softmax(model(**encoded).logits.double().numpy())
    return Answers(probabilities.argmax(axis=-1).tolist(), probabilities.max(axis=-1))


def _question_answering(
    model: Any, tokenizer: Any, pairs: Sequence[tuple[str, str]], max_length: int
) -> Answers:
    questions, contexts = zip(*pairs, strict=True)
    encoded = tokenizer(
        list(questions),
        list(contexts),
        truncation="only_second",
        max_length=max_length,
        padding=True,
        return_offsets_mapping=True,
        return_tensors="pt",
    )
    offsets = encoded.pop("offset_mapping").numpy()
    out = model(**{k: v for k, v in encoded.items() if k in tokenizer.model_input_names})
    start_logits, end_logits = out.start_logits.double().numpy(), out.end_logits.double().numpy()
    best: list[Hashable] = []
    scores = []
    for row in range(len(pairs)):
        context = np.array([s == 1 for s in encoded.sequence_ids(row)])
        row_offsets = np.where(context[:, None], offsets[row], NOT_CONTEXT)[None]
        start, end = start_logits[row : row + 1], end_logits[row : row + 1]
        spans = top_spans(start, end, row_offsets)
        best.append((spans[0].start_char, spans[0].end_char) if spans else None)
        scores.append(span_probabilities(start, end, row_offsets, spans[:1])[0] if spans else 0.0)
    return Answers(best, np.asarray(scores))


def _fill_mask(model: Any, tokenizer: Any, texts: Sequence[str], max_length: int) -> Answers:
    own = [t.replace(MASK, tokenizer.mask_token) for t in texts]
    encoded = tokenizer(own, truncation=True, max_length=max_length, padding=True, return_tensors="pt")
    logits = model(**encoded).logits
    rows = first_mask_positions(encoded["input_ids"].numpy(), tokenizer.mask_token_id)
    probabilities = _softmax(logits[np.arange(len(own)), rows].double().numpy())
    top = probabilities.argmax(axis=-1)
    # compared as text: a pair that does not share a vocabulary still agrees on a word
    return Answers([tokenizer.decode([int(t)]).strip() for t in top], probabilities.max(axis=-1))


def _relevance(model: Any, tokenizer: Any, pairs: Sequence[tuple[str, str]], max_length: int) -> Answers:
    """A cross-encoder's relevance logit of each (query, document) pair: what its ranking orders by."""
    queries, documents = zip(*pairs, strict=True)
    encoded = tokenizer(
        list(queries),
        list(documents),
        truncation=True,
        max_length=max_length,
        padding=True,
        return_tensors="pt",
    )
    logits = model(**encoded).logits.double().numpy()[:, 0]
    return Answers([None] * len(pairs), logits)


_ANSWERS: dict[str, Callable[[Any, Any, Sequence[Any], int], Answers]] = {
    "relevance": _relevance,
    "text-classification": _classification,
    "question-answering": _question_answering,
    "fill-mask": _fill_mask,
}


def _paying_limit(found: Calibration) -> PayingLimit:
    return PayingLimit(
        threshold=found.threshold, agreement=found.agreement, fallback_rate=found.fallback_rate
    )


def calibrate_pair(
    student: tuple[Any, Any],
    teacher: tuple[Any, Any],
    task: str,
    eval_data: Path,
    target: float,
    max_length: int,
    limit: int = CALIBRATION_EXAMPLES,
    progress: Callable[[str], None] = lambda message: None,
) -> CascadeCalibration:
    """The pair's threshold for `target` agreement, from both models' answers to the eval inputs; what the
    student costs beside the teacher (their times over the same inputs, batched alike), and so the most
    agreement a cascade cheaper than the teacher reaches (`paying_limit`)."""
    inputs = calibration_inputs(task, eval_data, limit)
    if not inputs:
        raise ValueError(f"{eval_data} holds no input to calibrate the cascade on")
    if task == "text-classification" and student[0].config.num_labels == 1:
        return _calibrate_ranking(student, teacher, inputs, target, max_length, progress, str(eval_data))
    progress(f"cascade calibration: the student on {len(inputs)} eval inputs")
    mine = answers(*student, task, inputs, max_length)
    progress(f"cascade calibration: the teacher on {len(inputs)} eval inputs")
    theirs = answers(*teacher, task, inputs, max_length)
    agrees = [a == b for a, b in zip(mine.best, theirs.best, strict=True)]
    found = calibrate(mine.confidence, agrees, target)
    cost = _cost(mine, theirs)
    paying = None if cost is None else paying_limit(mine.confidence, agrees, cost)
    return _recorded(found, target, str(eval_data), cost, paying, "top-score")


def _cost(mine: Answers, theirs: Answers) -> float | None:
    """The student's time over the calibration inputs ÷ the teacher's (None: not timed)."""
    return mine.seconds / theirs.seconds if mine.seconds > 0 and theirs.seconds > 0 else None


def _recorded(
    found: Calibration,
    target: float,
    source: str,
    cost: float | None,
    paying: Calibration | None,
    confidence: Literal["top-score", "score-margin"],
) -> CascadeCalibration:
    """A calibration as the student's manifest records it."""
    return CascadeCalibration(
        confidence=confidence,
        threshold=found.threshold,
        target_agreement=target,
        agreement=found.agreement,
        fallback_rate=found.fallback_rate,
        student_agreement=found.student_agreement,
        eval_examples=found.examples,
        eval_source=source,
        student_cost=cost,
        paying_limit=None if paying is None else _paying_limit(paying),
    )


def _calibrate_ranking(
    student: tuple[Any, Any],
    teacher: tuple[Any, Any],
    pairs: Sequence[Any],
    target: float,
    max_length: int,
    progress: Callable[[str], None],
    source: str,
) -> CascadeCalibration:
    """A cross-encoder pair's ranking cascade (common.cascade): the eval file's pairs grouped by query (its
    first text), each query's documents scored by both models, and the margin for `target` agreement on
    each query's best document."""
    by_query: dict[str, list[int]] = {}
    for i, pair in enumerate(pairs):
        if not isinstance(pair, tuple):
            raise ValueError(f"{source}: a cross-encoder is calibrated on (query, document) pairs")
        by_query.setdefault(pair[0], []).append(i)
    groups = [rows for rows in by_query.values() if len(rows) > 1]
    if not groups:
        raise ValueError(f"{source} holds no query with two documents or more to rank")
    flat = [pairs[i] for rows in groups for i in rows]
    progress(f"ranking cascade calibration: the student on {len(groups)} queries ({len(flat)} documents)")
    mine = answers(*student, "relevance", flat, max_length)
    progress(f"ranking cascade calibration: the teacher on {len(groups)} queries")
    theirs = answers(*teacher, "relevance", flat, max_length)
    bounds = np.cumsum([0, *map(len, groups)])
    scored = [(mine.confidence[a:b], theirs.confidence[a:b]) for a, b in itertools.pairwise(bounds)]
    found = calibrate_margin(scored, target)
    cost = _cost(mine, theirs)
    paying = None if cost is None else paying_margin(scored, cost)
    return _recorded(found, target, source, cost, paying, "score-margin")
