"""Predictions at every labelled position of an eval loader, for every task's metrics and agreement."""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.utils.data import DataLoader

from training.steps import Targets, logits_and_labels, model_inputs


@dataclass(frozen=True)
class Predictions:
    """One entry per labelled position (label != -100), in loader order."""

    top1: torch.Tensor  # the model's most likely id
    nll: torch.Tensor  # -log p(label), for perplexity
    labels: torch.Tensor

    @property
    def accuracy(self) -> float:
        return float((self.top1 == self.labels).float().mean()) if self.labels.numel() else 0.0


@torch.inference_mode()
def predict(
    model: nn.Module, loader: DataLoader, targets: Targets = logits_and_labels, ignore_index: int = -100
) -> Predictions:
    """Run the model over the loader (on its device, in eval mode) and keep what metrics need, per position:
    logits never pile up, so a [B, L, V] language-model eval costs memory for one batch only."""
    was_training = model.training
    model.eval()
    device = next(model.parameters()).device
    top1, nll, gold = [], [], []
    for batch in loader:
        batch = {key: value.to(device) for key, value in batch.items()}
        logits, labels = targets(model(**model_inputs(batch)), batch)
        logits, labels = logits.reshape(-1, logits.size(-1)).float(), labels.reshape(-1)
        keep = labels != ignore_index
        top1.append(logits[keep].argmax(-1).cpu())
        nll.append(F.cross_entropy(logits[keep], labels[keep], reduction="none").cpu())
        gold.append(labels[keep].cpu())
    model.train(was_training)
    return Predictions(torch.cat(top1), torch.cat(nll), torch.cat(gold))


def top1_agreement(student: Predictions, teacher: Predictions) -> float:
    """Share of positions where student and teacher pick the same top-1 id."""
    if student.top1.shape != teacher.top1.shape:
        raise ValueError("student and teacher were not evaluated on the same positions")
    return float((student.top1 == teacher.top1).float().mean()) if student.top1.numel() else 0.0
