"""Causal language modelling (GPT-2's text-generation) as a task module: token blocks, steps, perplexity.

The text lines are joined with `<|endoftext|>` (the tokenizer's eos) and cut into blocks of `max_length`
tokens, as GPT-2 was trained. Every position predicts the next token: the KD and the hard loss compare
logits at position i with the token at i + 1, and padding (only the last block has any) counts in neither.
"""

from __future__ import annotations

import math
from pathlib import Path

import torch
import torch.nn as nn
from torch.utils.data import DataLoader
from transformers import PretrainedConfig, PreTrainedModel, PreTrainedTokenizerBase

from training import steps
from training.batches import make_dataloader, pack, rows
from training.data.loaders import load_text_data
from training.data.types import TextData
from training.evaluation import predict, top1_agreement
from training.losses import LossTerms
from training.recipes import DistillConfig
from training.trainer import Batch, StepFn

TASK = "text-generation"
METRIC = "perplexity"
HIGHER_IS_BETTER = False
FAMILY = "gpt2"


def load_data(path: str | Path) -> TextData:
    return load_text_data(path)


def label_names(data: TextData) -> list[str]:
    """None: the model predicts tokens, not classes."""
    return []


def texts(data: TextData) -> list[str]:
    return data.lines


def blocks(data: TextData, tokenizer: PreTrainedTokenizerBase, max_length: int) -> Batch:
    """`line <|endoftext|> line <|endoftext|> ...` in blocks of `max_length`; labels -100 on padding."""
    eos = tokenizer.eos_token_id
    if eos is None:
        raise ValueError("text-generation needs a tokenizer with an eos token to separate the texts")
    encoded = tokenizer(data.lines, add_special_tokens=False, verbose=False)["input_ids"]
    pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else eos
    packed = pack([[*ids, eos] for ids in encoded], max_length, pad_id)
    return {**packed, "labels": packed["input_ids"].masked_fill(packed["attention_mask"] == 0, -100)}


def make_loader(
    data: TextData,
    tokenizer: PreTrainedTokenizerBase,
    config: PretrainedConfig,
    *,
    batch_size: int,
    max_length: int,
    shuffle: bool,
    seed: int = 0,
) -> DataLoader:
    """Blocks of text, shuffled (seeded) for training and in order for evaluation."""
    return make_dataloader(
        rows(blocks(data, tokenizer, max_length)), batch_size=batch_size, shuffle=shuffle, seed=seed
    )


def next_token_targets(output: object, batch: Batch) -> tuple[torch.Tensor, torch.Tensor]:
    """Logits at positions 0..L-2 against the tokens at 1..L-1 (the model does not see the future)."""
    logits: torch.Tensor = output.logits  # type: ignore[attr-defined]
    return logits[:, :-1], batch["labels"][:, 1:]


def teacher_step(model: nn.Module, batch: Batch, teacher: nn.Module | None = None) -> LossTerms:
    """The language-modelling loss: cross-entropy of every next token."""
    return steps.hard_step(model, batch, next_token_targets)


def distill_step(config: DistillConfig, alignment: steps.HiddenAlignment | None = None) -> StepFn:
    """KD on the next-token distributions plus the language-modelling loss."""
    return steps.distill_step(config, next_token_targets, alignment)


def evaluate(
    model: PreTrainedModel,
    data: TextData,
    tokenizer: PreTrainedTokenizerBase,
    *,
    max_length: int = 128,
    batch_size: int = 64,
) -> dict[str, float]:
    """Perplexity: exp of the mean negative log-likelihood over every predicted token of the eval text
    (the first token of each block has no context and is not predicted); and next-token accuracy."""
    loader = make_loader(
        data, tokenizer, model.config, batch_size=batch_size, max_length=max_length, shuffle=False
    )
    predictions = predict(model, loader, next_token_targets)
    nll = float(predictions.nll.mean())
    return {METRIC: math.exp(nll), "nll": nll, "accuracy": predictions.accuracy}


def agreement(
    student: PreTrainedModel,
    teacher: PreTrainedModel,
    data: TextData,
    tokenizer: PreTrainedTokenizerBase,
    *,
    max_length: int = 128,
    batch_size: int = 64,
) -> float:
    """Share of eval positions where student and teacher predict the same next token."""
    loader = make_loader(
        data, tokenizer, teacher.config, batch_size=batch_size, max_length=max_length, shuffle=False
    )
    return top1_agreement(
        predict(student, loader, next_token_targets), predict(teacher, loader, next_token_targets)
    )
