"""Extractive question answering (SQuAD v1.1) as a task module: windows, training steps, spans and metrics.

Offers the names of the `training.runs.Task` protocol, as `training.classification` does. A question and a
long context become several windows of `max_length` tokens that share `doc_stride` context tokens; the model
scores every token as the answer's start and end, and the answer is the best valid span over all of an
example's windows (`common.spans`: numpy only, the same code the service answers with).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.nn as nn
from torch.utils.data import DataLoader
from transformers import PretrainedConfig, PreTrainedModel, PreTrainedTokenizerBase

from common.spans import MAX_ANSWER_LENGTH, NOT_CONTEXT, Span, answer_text, best_span
from training import steps
from training.batches import make_dataloader, pad
from training.data.loaders import load_squad
from training.data.types import QAExample
from training.losses import LossTerms
from training.recipes import DistillConfig
from training.squad_metrics import squad_scores
from training.trainer import Batch, StepFn

TASK = "question-answering"
METRIC = "f1"  # SQuAD v1.1 token F1, as a fraction; evaluate() also returns exact_match
HIGHER_IS_BETTER = True
FAMILY = "bert"  # an encoder that reads question and context together

Progress = Callable[[int, int], None]  # (done, total), e.g. windows run through a model

MAX_LENGTH = 384  # BERT's SQuAD recipe; the demo models use shorter windows
CLS_INDEX = 0  # the label of a window that does not hold the whole answer
# Logit given to padding before the softmax: a window's loss then does not depend on how much its
# batch was padded, and the student is not asked to imitate the teacher's logits on padding.
PAD_LOGIT = -1e4
# Examples tokenised per tokenizer call: its Python output is ~10x the size of the windows kept from it.
ENCODE_CHUNK = 1000


@dataclass(frozen=True)
class QAData:
    """SQuAD examples (one per question) and the file they came from."""

    examples: list[QAExample]
    source: str


@dataclass(frozen=True, eq=False)
class Window:
    """One question + context window as the model sees it, and what maps its tokens back to the context.

    Arrays rather than lists of Python ints: full SQuAD train is ~90k windows of up to 384 tokens.
    """

    example: int  # index of its example in QAData.examples
    inputs: dict[str, np.ndarray]  # the tokenizer's model inputs, unpadded, int32 [L]
    offsets: np.ndarray  # [L, 2] int32 characters of the context per token; NOT_CONTEXT outside it
    start: int  # first answer token, CLS_INDEX when the answer is not wholly inside this window
    end: int  # last answer token (inclusive), CLS_INDEX likewise


def load_data(path: str | Path) -> QAData:
    return QAData(examples=load_squad(path), source=str(path))


def label_names(data: QAData) -> list[str]:
    """No label head: the answer is a span of the context."""
    return []


def texts(data: QAData) -> list[str]:
    """Questions and each distinct context once (a paragraph has several questions), for vocabularies."""
    contexts = dict.fromkeys(example.context for example in data.examples)
    return [example.question for example in data.examples] + list(contexts)


def default_stride(max_length: int) -> int:
    """A third of the window (128 at 384, as in the HF SQuAD examples)."""
    return max_length // 3


# --------------------------------------------------------------------------- windows and labels


def answer_chars(example: QAExample) -> tuple[int, int] | None:
    """The first gold answer as [start, end) characters, without surrounding whitespace (never a token)."""
    if not example.answers:
        return None
    answer = example.answers[0]
    stripped = answer.text.strip()
    if not stripped:
        return None
    start = answer.start + answer.text.index(stripped)
    return start, start + len(stripped)


def token_span(offsets: np.ndarray, answer: tuple[int, int] | None) -> tuple[int, int]:
    """The answer's first and last token in a window ([L, 2] offsets), or (CLS, CLS) unless wholly inside.

    First: the first context token ending after the answer starts; last: the last one starting before it
    ends. An answer that starts or ends inside a token therefore grows to whole tokens.
    """
    context = np.flatnonzero(offsets[:, 0] != NOT_CONTEXT)
    if answer is None or context.size == 0:
        return CLS_INDEX, CLS_INDEX
    char_start, char_end = answer
    if offsets[context[0], 0] > char_start or offsets[context[-1], 1] < char_end:
        return CLS_INDEX, CLS_INDEX
    start = int(context[offsets[context, 1] > char_start][0])
    end = int(context[offsets[context, 0] < char_end][-1])
    return (start, end) if start <= end else (CLS_INDEX, CLS_INDEX)


def _check_room(data: QAData, tokenizer: PreTrainedTokenizerBase, max_length: int, doc_stride: int) -> None:
    """Fail clearly where the tokenizer would panic: each window must fit more than `doc_stride` context."""
    special = tokenizer.num_special_tokens_to_add(pair=True)
    questions = tokenizer([e.question for e in data.examples], add_special_tokens=False)["input_ids"]
    for example, ids in zip(data.examples, questions, strict=True):
        if max_length - special - len(ids) <= doc_stride:
            raise ValueError(
                f"{data.source}: question {example.id!r} takes {len(ids)} of {max_length} tokens, leaving "
                f"no more than doc_stride={doc_stride} for the context; raise max_length or lower doc_stride"
            )


def encode(
    data: QAData, tokenizer: PreTrainedTokenizerBase, *, max_length: int, doc_stride: int | None = None
) -> list[Window]:
    """Tokenise every question + context pair into windows (unpadded; padding happens per batch).

    `doc_stride`: context tokens shared by consecutive windows of one example (None: `default_stride`).
    """
    stride = default_stride(max_length) if doc_stride is None else doc_stride
    if not data.examples:
        return []
    _check_room(data, tokenizer, max_length, stride)
    windows: list[Window] = []
    for first in range(0, len(data.examples), ENCODE_CHUNK):
        windows += _windows(data.examples[first : first + ENCODE_CHUNK], first, tokenizer, max_length, stride)
    return windows


def _windows(
    examples: Sequence[QAExample],
    first: int,
    tokenizer: PreTrainedTokenizerBase,
    max_length: int,
    stride: int,
) -> list[Window]:
    """The windows of `examples`, which start at index `first` of their data."""
    encoded = tokenizer(
        [e.question for e in examples],
        [e.context for e in examples],
        truncation="only_second",
        max_length=max_length,
        stride=stride,
        return_overflowing_tokens=True,
        return_offsets_mapping=True,
    )
    keys = [key for key in tokenizer.model_input_names if key in encoded]
    windows = []
    for i, k in enumerate(encoded["overflow_to_sample_mapping"]):
        offsets = np.asarray(encoded["offset_mapping"][i], dtype=np.int32).reshape(-1, 2)
        offsets[[sequence != 1 for sequence in encoded.sequence_ids(i)]] = NOT_CONTEXT
        inputs = {key: np.asarray(encoded[key][i], dtype=np.int32) for key in keys}
        start, end = token_span(offsets, answer_chars(examples[k]))
        windows.append(Window(first + k, inputs, offsets, start, end))
    return windows


def collate(windows: Sequence[Window], pad_token_id: int) -> Batch:
    """Right-pad the model inputs to the batch's longest window; the answer tokens become the targets."""
    batch: Batch = {
        key: pad([w.inputs[key].tolist() for w in windows], pad_token_id if key == "input_ids" else 0)
        for key in windows[0].inputs
    }
    batch["start_positions"] = torch.tensor([w.start for w in windows], dtype=torch.long)
    batch["end_positions"] = torch.tensor([w.end for w in windows], dtype=torch.long)
    return batch


def _pad_id(tokenizer: PreTrainedTokenizerBase) -> int:
    return tokenizer.pad_token_id if tokenizer.pad_token_id is not None else 0


def make_loader(
    data: QAData,
    tokenizer: PreTrainedTokenizerBase,
    config: PretrainedConfig | None = None,
    *,
    batch_size: int,
    max_length: int,
    shuffle: bool,
    seed: int = 0,
    doc_stride: int | None = None,
) -> DataLoader:
    """Batches of windows (several per long context, see `encode`); `config` is unused: QA has no labels."""
    windows = encode(data, tokenizer, max_length=max_length, doc_stride=doc_stride)
    if not shuffle:  # similar lengths together waste less compute on padding
        windows = sorted(windows, key=lambda w: len(w.offsets))
    pad_id = _pad_id(tokenizer)
    return make_dataloader(
        windows, lambda items: collate(items, pad_id), batch_size=batch_size, shuffle=shuffle, seed=seed
    )


# --------------------------------------------------------------------------- training steps


def span_targets(output: Any, batch: Batch) -> tuple[torch.Tensor, torch.Tensor]:
    """Start and end logits as two rows per window, [B, 2, L], against [B, 2] answer tokens (`steps.Targets`).

    The shared losses average over rows, so each is the mean of its start and end terms, as in
    BertForQuestionAnswering's own loss. Padding gets PAD_LOGIT.
    """
    logits = torch.stack([output.start_logits, output.end_logits], dim=1)
    if "attention_mask" in batch:
        logits = logits.masked_fill(batch["attention_mask"][:, None, :] == 0, PAD_LOGIT)
    return logits, torch.stack([batch["start_positions"], batch["end_positions"]], dim=1)


def teacher_step(model: nn.Module, batch: Batch, teacher: nn.Module | None = None) -> LossTerms:
    """Cross-entropy of the start and of the end token, averaged."""
    return steps.hard_step(model, batch, span_targets)


def distill_step(config: DistillConfig, alignment: steps.HiddenAlignment | None = None) -> StepFn:
    """Match the frozen teacher's softened start and end distributions (KD on each, averaged) and the
    answer tokens; with an alignment, the teacher's hidden states too."""
    return steps.distill_step(config, span_targets, alignment, steps.TeacherMemo(pad_logit=PAD_LOGIT))


# --------------------------------------------------------------------------- prediction and metrics


@torch.inference_mode()
def window_logits(
    model: nn.Module,
    windows: Sequence[Window],
    pad_token_id: int,
    batch_size: int = 64,
    on_batch: Progress | None = None,
) -> list[tuple[np.ndarray, np.ndarray]]:
    """(start, end) logits of every window, unpadded, in the windows' order; eval mode, model's device.
    `on_batch(done, total)` after each batch, in windows."""
    was_training = model.training
    model.eval()
    device = next(model.parameters()).device
    by_length = sorted(range(len(windows)), key=lambda i: len(windows[i].offsets))
    out: dict[int, tuple[np.ndarray, np.ndarray]] = {}
    for first in range(0, len(by_length), batch_size):
        chosen = by_length[first : first + batch_size]
        batch = steps.model_inputs(collate([windows[i] for i in chosen], pad_token_id))
        output = model(**{key: value.to(device) for key, value in batch.items()})
        starts, ends = output.start_logits.float().cpu().numpy(), output.end_logits.float().cpu().numpy()
        for row, i in enumerate(chosen):
            n = len(windows[i].offsets)
            out[i] = (starts[row, :n], ends[row, :n])
        if on_batch is not None:
            on_batch(len(out), len(windows))
    model.train(was_training)
    return [out[i] for i in range(len(windows))]


def spans_from_logits(
    windows: Sequence[Window],
    logits: Sequence[tuple[np.ndarray, np.ndarray]],
    n_examples: int,
    *,
    max_answer_length: int = MAX_ANSWER_LENGTH,
) -> list[Span | None]:
    """Each example's best span over all its windows (`common.spans.best_span`); None without windows."""
    grouped: list[list[int]] = [[] for _ in range(n_examples)]
    for i, window in enumerate(windows):
        grouped[window.example].append(i)
    spans: list[Span | None] = []
    for members in grouped:
        length = max((len(windows[i].offsets) for i in members), default=0)
        start, end = np.zeros((len(members), length)), np.zeros((len(members), length))
        offsets = np.full((len(members), length, 2), NOT_CONTEXT, dtype=np.int64)
        for row, i in enumerate(members):
            n = len(windows[i].offsets)
            start[row, :n], end[row, :n] = logits[i]
            offsets[row, :n] = windows[i].offsets
        spans.append(best_span(start, end, offsets, max_answer_length=max_answer_length))
    return spans


def predict_spans(
    model: nn.Module,
    data: QAData,
    tokenizer: PreTrainedTokenizerBase,
    *,
    max_length: int = MAX_LENGTH,
    batch_size: int = 64,
    doc_stride: int | None = None,
    max_answer_length: int = MAX_ANSWER_LENGTH,
    on_batch: Progress | None = None,
) -> list[Span | None]:
    """The model's answer span for every example, in the data's order."""
    windows = encode(data, tokenizer, max_length=max_length, doc_stride=doc_stride)
    logits = window_logits(model, windows, _pad_id(tokenizer), batch_size, on_batch)
    return spans_from_logits(windows, logits, len(data.examples), max_answer_length=max_answer_length)


def evaluate(
    model: PreTrainedModel,
    data: QAData,
    tokenizer: PreTrainedTokenizerBase,
    *,
    max_length: int = MAX_LENGTH,
    batch_size: int = 64,
    doc_stride: int | None = None,
    max_answer_length: int = MAX_ANSWER_LENGTH,
) -> dict[str, float]:
    """SQuAD v1.1 F1 and exact match (fractions) of the model's answers against every gold answer."""
    spans = predict_spans(
        model,
        data,
        tokenizer,
        max_length=max_length,
        batch_size=batch_size,
        doc_stride=doc_stride,
        max_answer_length=max_answer_length,
    )
    predictions = [answer_text(e.context, span) for e, span in zip(data.examples, spans, strict=True)]
    scores = squad_scores(predictions, [[a.text for a in e.answers] for e in data.examples])
    return {METRIC: scores.f1, "exact_match": scores.exact_match}


def agreement(
    student: PreTrainedModel,
    teacher: PreTrainedModel,
    data: QAData,
    tokenizer: PreTrainedTokenizerBase,
    *,
    max_length: int = MAX_LENGTH,
    batch_size: int = 64,
    doc_stride: int | None = None,
    max_answer_length: int = MAX_ANSWER_LENGTH,
) -> float:
    """Share of examples where student and teacher extract the same characters of the context."""
    student_spans, teacher_spans = (
        predict_spans(
            model,
            data,
            tokenizer,
            max_length=max_length,
            batch_size=batch_size,
            doc_stride=doc_stride,
            max_answer_length=max_answer_length,
        )
        for model in (student, teacher)
    )
    same = sum(_chars(s) == _chars(t) for s, t in zip(student_spans, teacher_spans, strict=True))
    return same / max(len(data.examples), 1)


def _chars(span: Span | None) -> tuple[int, int] | None:
    return None if span is None else (span.start_char, span.end_char)
