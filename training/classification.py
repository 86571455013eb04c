"""Text classification as a task module: examples -> batches, the training steps, and the metrics.

Sibling modules (qa, fill_mask, generation) offer the same names, so `training.runs` stays task-agnostic:
TASK, METRIC, load_data, label_names, texts, make_loader, teacher_step, distill_step, evaluate, agreement.
"""

from __future__ import annotations

import random
from collections.abc import Mapping, Sequence
from pathlib import Path

import torch
import torch.nn as nn
from torch.utils.data import DataLoader
from transformers import PreTrainedModel, PreTrainedTokenizerBase

from training.data.loaders import load_classification
from training.data.types import ClassificationData
from training.losses import LossTerms, distillation_loss, hard_loss
from training.trainer import Batch, StepFn

TASK = "text-classification"
METRIC = "accuracy"

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
    """Tokenise once, unpadded: padding happens per batch, to that batch's longest example."""
    encoded = tokenizer(texts(data), truncation=True, max_length=max_length)
    to_model = model_label_ids(data, label2id)
    keys = [key for key in tokenizer.model_input_names if key in encoded]
    return [
        {**{key: encoded[key][i] for key in keys}, "labels": [to_model[example.label]]}
        for i, example in enumerate(data.examples)
    ]


def collate(features: Sequence[Features], pad_token_id: int) -> Batch:
    """Dynamic padding: right-pad every input to the longest in the batch (ids with pad, masks with 0)."""
    longest = max(len(f["input_ids"]) for f in features)
    batch: Batch = {}
    for key in features[0]:
        if key == "labels":
            batch[key] = torch.tensor([f[key][0] for f in features], dtype=torch.long)
            continue
        fill = pad_token_id if key == "input_ids" else 0
        batch[key] = torch.tensor(
            [f[key] + [fill] * (longest - len(f[key])) for f in features], dtype=torch.long
        )
    return batch


def make_loader(
    data: ClassificationData,
    tokenizer: PreTrainedTokenizerBase,
    label2id: Mapping[str, int],
    *,
    batch_size: int,
    max_length: int,
    shuffle: bool,
    seed: int = 0,
) -> DataLoader:
    """Shuffled (seeded) batches for training; for evaluation, batches of similar lengths, in order."""
    features = encode(data, tokenizer, label2id, max_length)
    pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else 0
    if not shuffle:  # sorting by length wastes less compute on padding; agreement() relies on a fixed order
        features = sorted(features, key=lambda f: len(f["input_ids"]))
    generator = torch.Generator().manual_seed(seed)
    return DataLoader(
        features,  # type: ignore[arg-type]  # a list is a map-style dataset
        batch_size=batch_size,
        shuffle=shuffle,
        generator=generator,
        collate_fn=lambda items: collate(items, pad_id),
    )


def _inputs(batch: Batch) -> Batch:
    return {k: v for k, v in batch.items() if k != "labels"}


def teacher_step(model: nn.Module, batch: Batch, teacher: nn.Module | None = None) -> LossTerms:
    """Hard labels only: fine-tuning or training a teacher."""
    return hard_loss(model(**_inputs(batch)).logits, batch["labels"])


def distill_step(temperature: float, alpha_kd: float, alpha_hard: float) -> StepFn:
    """A step that matches the frozen teacher's softened class distribution and the hard labels."""

    def step(student: nn.Module, batch: Batch, teacher: nn.Module | None) -> LossTerms:
        if teacher is None:
            raise ValueError("distillation needs a teacher")
        inputs = _inputs(batch)
        with torch.no_grad():
            teacher_logits = teacher(**inputs).logits
        return distillation_loss(
            student(**inputs).logits,
            teacher_logits,
            batch["labels"],
            temperature=temperature,
            alpha_kd=alpha_kd,
            alpha_hard=alpha_hard,
        )

    return step


def labels_of(model: PreTrainedModel) -> dict[str, int]:
    """The model's label name -> id map (transformers fills in LABEL_i names when none were given)."""
    return dict(model.config.label2id or {})


@torch.inference_mode()
def predict(model: nn.Module, loader: DataLoader) -> tuple[torch.Tensor, torch.Tensor]:
    """(predicted label ids, gold label ids) over the loader, on the model's device, in eval mode."""
    was_training = model.training
    model.eval()
    device = next(model.parameters()).device
    predicted, gold = [], []
    for batch in loader:
        logits = model(**{k: v.to(device) for k, v in _inputs(batch).items()}).logits
        predicted.append(logits.argmax(-1).cpu())
        gold.append(batch["labels"])
    model.train(was_training)
    return torch.cat(predicted), torch.cat(gold)


def evaluate(
    model: PreTrainedModel,
    data: ClassificationData,
    tokenizer: PreTrainedTokenizerBase,
    *,
    max_length: int = 128,
    batch_size: int = 64,
) -> float:
    """Accuracy of the model on `data`."""
    loader = make_loader(
        data, tokenizer, labels_of(model), batch_size=batch_size, max_length=max_length, shuffle=False
    )
    predicted, gold = predict(model, loader)
    return float((predicted == gold).float().mean())


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
        data,
        tokenizer,
        labels_of(teacher),
        batch_size=batch_size,
        max_length=max_length,
        shuffle=False,
    )
    teacher_ids, _ = predict(teacher, loader)
    student_ids, _ = predict(student, loader)
    teacher_names, student_names = teacher.config.id2label or {}, student.config.id2label or {}
    same = sum(
        teacher_names[int(t)] == student_names[int(s)] for t, s in zip(teacher_ids, student_ids, strict=True)
    )
    return same / max(len(teacher_ids), 1)


def sample_texts(data: ClassificationData, count: int, seed: int = 0) -> list[str]:
    """`count` texts (cycled when the data is smaller), e.g. for latency measurements."""
    pool = texts(data)
    random.Random(seed).shuffle(pool)
    return [pool[i % len(pool)] for i in range(count)]
