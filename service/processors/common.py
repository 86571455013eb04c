"""What every processor shares: the request error type, timing tokenization, submitting many items."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import Any

from service.metrics import Metrics
from service.runtime import ServedModel


class InvalidInputError(ValueError):
    """Well-formed JSON asking for something the model cannot do (HTTP 422)."""


@contextmanager
def tokenizing(metrics: Metrics, model: ServedModel) -> Iterator[None]:
    started = time.perf_counter()
    yield
    metrics.tokenize_duration.labels(model.name).observe(time.perf_counter() - started)


async def run_all(model: ServedModel, items: Sequence[Any], timeout_s: float) -> list[Any]:
    """Submit every item to the model's batcher; they may land in the same or in different batches."""
    return list(await asyncio.gather(*(model.batcher.submit(item, timeout_s=timeout_s) for item in items)))
