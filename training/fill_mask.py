"""Masked language modelling (BERT's fill-mask) as a task module: text blocks, masking, steps, accuracy.

Each text line becomes `[CLS] line [SEP]`; the lines are packed into blocks of `max_length` tokens (BERT's
pretraining layout: no compute spent on padding). Training draws a fresh mask for every batch (RoBERTa's
dynamic masking, seeded); evaluation masks the eval blocks once, with a fixed seed, so every model and
every run is scored on the very same masked tokens. Only masked tokens carry labels, so both the KD and
the hard loss look at those positions alone.
"""

from __future__ import annotations

import zlib
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.nn as nn
from torch.utils.data import DataLoader, default_collate
from transformers import PretrainedConfig, PreTrainedModel, PreTrainedTokenizerBase

from training import steps
from training.batches import make_dataloader, pack, rows
from training.data.loaders import load_text_data
from training.data.types import TextData
from training.evaluation import predict, top1_agreement
from training.losses import LossTerms
from training.recipes import DistillConfig
from training.trainer import Batch, StepFn

TASK = "fill-mask"
METRIC = "accuracy"  # top-1 on the masked tokens
HIGHER_IS_BETTER = True
FAMILY = "bert"

MASK_PROBABILITY = 0.15
EVAL_SEED = 0  # the fixed eval mask, independent of the run's seed: teacher and student scores compare


def load_data(path: str | Path) -> TextData:
    return load_text_data(path)


def label_names(data: TextData) -> list[str]:
    """None: the model predicts tokens, not classes."""
    return []


def texts(data: TextData) -> list[str]:
    return data.lines


@dataclass(frozen=True)
class MaskingIds:
    """What masking needs from the tokenizer: the [MASK] id, ids never masked, ids a random swap draws."""

    mask_id: int
    special_ids: torch.Tensor
    ordinary_ids: torch.Tensor

    @classmethod
    def of(cls, tokenizer: PreTrainedTokenizerBase) -> MaskingIds:
        if tokenizer.mask_token_id is None:
            raise ValueError("fill-mask needs a tokenizer with a mask token")
        special = sorted(set(tokenizer.all_special_ids))
        ordinary = sorted(set(range(len(tokenizer))) - set(special))
        return cls(int(tokenizer.mask_token_id), torch.tensor(special), torch.tensor(ordinary))


def mask_tokens(
    batch: Batch, ids: MaskingIds, generator: torch.Generator, probability: float = MASK_PROBABILITY
) -> Batch:
    """BERT's masking: each real, non-special token is chosen with `probability`; a chosen token becomes
    [MASK] 80 % of the time, a random ordinary token 10 %, and stays itself 10 % (so the model cannot
    learn that only [MASK] positions matter). Labels are the original ids there and -100 elsewhere."""
    input_ids = batch["input_ids"]
    candidates = batch["attention_mask"].bool() & ~torch.isin(input_ids, ids.special_ids)
    chosen = candidates & (torch.rand(input_ids.shape, generator=generator) < probability)
    roll = torch.rand(input_ids.shape, generator=generator)
    swaps = ids.ordinary_ids[torch.randint(len(ids.ordinary_ids), input_ids.shape, generator=generator)]

    masked = input_ids.clone()
    masked[chosen & (roll < 0.8)] = ids.mask_id
    randomised = chosen & (roll >= 0.8) & (roll < 0.9)
    masked[randomised] = swaps[randomised]
    return {**batch, "input_ids": masked, "labels": input_ids.masked_fill(~chosen, -100)}


def blocks(data: TextData, tokenizer: PreTrainedTokenizerBase, max_length: int) -> Batch:
    """`[CLS] line [SEP]` for every line, packed into blocks of `max_length` (unmasked, no labels)."""
    encoded = tokenizer(data.lines, verbose=False)["input_ids"]  # long lines are split by packing
    pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else 0
    return pack(encoded, max_length, pad_id)


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
    """Training (shuffle): a fresh mask per batch. Evaluation: one fixed mask (EVAL_SEED), in order."""
    ids = MaskingIds.of(tokenizer)
    packed = blocks(data, tokenizer, max_length)
    if not shuffle:
        masked = mask_tokens(packed, ids, torch.Generator().manual_seed(EVAL_SEED))
        return make_dataloader(rows(masked), batch_size=batch_size, shuffle=False)

    def collate(items: list[Batch]) -> Batch:
        """The mask is a function of (seed, which blocks are in the batch): every epoch's new shuffle
        brings new masks, yet a run resumed from a checkpoint draws exactly those of the uninterrupted run."""
        batch = default_collate(items)
        index = batch.pop("index")
        generator = torch.Generator().manual_seed(seed << 32 | zlib.crc32(index.numpy().tobytes()))
        return mask_tokens(batch, ids, generator)

    packed["index"] = torch.arange(len(packed["input_ids"]))
    return make_dataloader(rows(packed), collate, batch_size=batch_size, shuffle=True, seed=seed)


def teacher_step(model: nn.Module, batch: Batch, teacher: nn.Module | None = None) -> LossTerms:
    """The MLM loss: cross-entropy on the masked tokens."""
    return steps.hard_step(model, batch)


def distill_step(config: DistillConfig, alignment: steps.HiddenAlignment | None = None) -> StepFn:
    """KD on the masked tokens' vocabulary logits plus the MLM loss (labels are -100 elsewhere)."""
    return steps.distill_step(config, alignment=alignment)


def evaluate(
    model: PreTrainedModel,
    data: TextData,
    tokenizer: PreTrainedTokenizerBase,
    *,
    max_length: int = 128,
    batch_size: int = 64,
) -> dict[str, float]:
    """Top-1 accuracy on the fixed eval mask, and the masked tokens' mean negative log-likelihood."""
    loader = make_loader(
        data, tokenizer, model.config, batch_size=batch_size, max_length=max_length, shuffle=False
    )
    predictions = predict(model, loader)
    return {METRIC: predictions.accuracy, "nll": float(predictions.nll.mean())}


def agreement(
    student: PreTrainedModel,
    teacher: PreTrainedModel,
    data: TextData,
    tokenizer: PreTrainedTokenizerBase,
    *,
    max_length: int = 128,
    batch_size: int = 64,
) -> float:
    """Share of masked eval tokens where student and teacher predict the same token."""
    loader = make_loader(
        data, tokenizer, teacher.config, batch_size=batch_size, max_length=max_length, shuffle=False
    )
    return top1_agreement(predict(student, loader), predict(teacher, loader))
