"""Text classification as a task module: examples -> batches, the training steps, and the metrics.

Sibling modules (qa, fill_mask, generation) offer the same names, so `training.runs` stays task-agnostic
(the protocol is `training.runs.Task`).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path

import torch
import torch.nn as nn
from torch.utils.data import DataLoader
from transformers import PretrainedConfig, PreTrainedModel, PreTrainedTokenizerBase

from training import steps
from training.batches import make_dataloader, pad
from training.data.loaders import load_classification
from training.data.types import ClassificationData
from training.evaluation import predict
from training.losses import LossTerms
from training.recipes import DistillConfig
from training.trainer import Batch, StepFn

TASK = "text-classification"
METRIC = "accuracy"
HIGHER_IS_BETTER = True
FAMILY = "bert"

Features = dict[str, list[int]]


def load_data(path: str | Path) -> ClassificationData:
    return load_classification(path)


def label_names(data: ClassificationData) -> list[str]:
    return list(data.label_names)


def texts(data: ClassificationData) -> list[str]:
    return [example.text for example in data.examples]


def model_label_ids(data: ClassificationData, label2id: Mapping[str, int]) -> list[int]:
    """Data label id -> model label id, matching names case-insensitively (a hub head may say POSITIVE)."""
    by_name = {name.lower(): int(i) for name, i in label2id.items()}
    missing = [name for name in data.label_names if name.lower() not in by_name]
    if missing:
        raise ValueError(f"{data.source}: labels {missing} are not among the model's {sorted(label2id)}")
    return [by_name[name.lower()] for name in data.label_names]


def encode(
    data: ClassificationData, tokenizer: PreTrainedTokenizerBase, label2id: Mapping[str, int], max_length: int
) -> list[Features]:
    """Tokenise once, unpadded: padding happens per batch, to that batch's longest example. Pairs are
    read as one sequence of two segments, the longer cut first (as the service reads them)."""
    pairs = [example.pair for example in data.examples]
    if pairs and pairs[0] is not None:
        encoded = tokenizer(texts(data), pairs, truncation="longest_first", max_length=max_length)
    else:
        encoded = tokenizer(texts(data), truncation=True, max_length=max_length)
    to_model = model_label_ids(data, label2id)
    keys = [key for key in tokenizer.model_input_names if key in encoded]
    return [
        {**{key: encoded[key][i] for key in keys}, "labels": [to_model[example.label]]}
        for i, example in enumerate(data.examples)
    ]


def collate(features: Sequence[Features], pad_token_id: int) -> Batch:
    """Dynamic padding: right-pad every input to the longest in the batch (ids with pad, masks with 0)."""
    batch: Batch = {}
    for key in features[0]:
        if key == "labels":
            batch[key] = torch.tensor([f[key][0] for f in features], dtype=torch.long)
        else:
            batch[key] = pad([f[key] for f in features], pad_token_id if key == "input_ids" else 0)
    return batch


def make_loader(
    data: ClassificationData,
    tokenizer: PreTrainedTokenizerBase,
    config: PretrainedConfig,
    *,
    batch_size: int,
    max_length: int,
    shuffle: bool,
    seed: int = 0,
) -> DataLoader:
    """Shuffled (seeded) batches for training; for evaluation, batches of similar lengths, in order.

    Labels are mapped by name onto the ids of the model `config` belongs to.
    """
    features = encode(data, tokenizer, config.label2id or {}, max_length)
    pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else 0
    if not shuffle:  # sorting by length wastes less compute on padding; agreement() relies on a fixed order
        features = sorted(features, key=lambda f: len(f["input_ids"]))
    return make_dataloader(
        features,
        lambda items: collate(items, pad_id),
        batch_size=batch_size,
        shuffle=shuffle,
        seed=seed,
    )


def teacher_step(model: nn.Module, batch: Batch, teacher: nn.Module | None = None) -> LossTerms:
    """Hard labels only: fine-tuning or training a teacher."""
    return steps.hard_step(model, batch)


def distill_step(config: DistillConfig, alignment: steps.HiddenAlignment | None = None) -> StepFn:
    """Match the frozen teacher's softened class distribution and the hard labels."""
    return steps.distill_step(config, alignment=alignment, memo=steps.TeacherMemo())


def evaluate(
    model: PreTrainedModel,
    data: ClassificationData,
    tokenizer: PreTrainedTokenizerBase,
    *,
    max_length: int = 128,
    batch_size: int = 64,
) -> dict[str, float]:
    """Accuracy of the model on `data`."""
    loader = make_loader(
        data, tokenizer, model.config, batch_size=batch_size, max_length=max_length, shuffle=False
    )
    return {METRIC: predict(model, loader).accuracy}


def agreement(
    student: PreTrainedModel,
    teacher: PreTrainedModel,
    data: ClassificationData,
    tokenizer: PreTrainedTokenizerBase,
    *,
    max_length: int = 128,
    batch_size: int = 64,
) -> float:
    """Share of examples where student and teacher pick the same top-1 label (by name)."""
    loader = make_loader(
        data, tokenizer, teacher.config, batch_size=batch_size, max_length=max_length, shuffle=False
    )
    teacher_ids, student_ids = predict(teacher, loader).top1, predict(student, loader).top1
    teacher_names, student_names = teacher.config.id2label or {}, student.config.id2label or {}
    same = sum(
        teacher_names[int(t)] == student_names[int(s)] for t, s in zip(teacher_ids, student_ids, strict=True)
    )
    return same / max(len(teacher_ids), 1)
