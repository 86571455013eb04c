"""Texts -> the top-k labels of each."""

from __future__ import annotations

from collections.abc import Sequence

from service.metrics import Metrics
from service.processors.common import check_chars, enforce_window, run_all, tokenizing
from service.served import ServedModel
from service.tasks.classification import LabelScore, top_labels


async def classify(
    model: ServedModel, texts: Sequence[str], top_k: int, metrics: Metrics, timeout_s: float
) -> list[list[LabelScore]]:
    check_chars(texts)
    with tokenizing(metrics, model):
        encoded = model.encoder.encode(texts)
    enforce_window(encoded, model.encoder.max_length)
    outputs = await run_all(model, encoded, timeout_s)
    return [top_labels(o["probabilities"], model.manifest.labels, top_k) for o in outputs]
