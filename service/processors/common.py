"""What every processor shares: the request error type, the text limits, timing, submitting many items."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Iterable, Iterator, Sequence
from contextlib import contextmanager
from typing import Any, TypeVar

from service.batching import ItemTiming
from service.metrics import Metrics
from service.request_context import current
from service.runtime import ServedModel
from service.tokenization import EncodedText

T = TypeVar("T")


class InvalidInputError(ValueError):
    """Well-formed JSON asking for something the model cannot do (HTTP 422)."""


def check_chars(texts: Sequence[str], what: str = "input") -> None:
    """Refuse a text over the raw-character cap before tokenizing it: tokenizing is the costly part."""
    limit = current().limits.max_chars
    for i, text in enumerate(texts):
        if len(text) > limit:
            where = f"{what} {i}" if len(texts) > 1 else f"the {what}"
            raise InvalidInputError(f"{where} is {len(text)} characters, at most {limit}")


def enforce_window(encoded: Sequence[EncodedText], window: int) -> None:
    """Texts past the model's window: keep the truncated encoding or refuse, per the server's policy.

    The number truncated goes on the request's context, from which the HTTP layer tells the client.
    """
    over = [i for i, e in enumerate(encoded) if e.truncated or len(e) > window]
    for i in over:
        where = f"input {i}" if len(encoded) > 1 else "the input"
        if current().limits.truncation == "reject":
            raise InvalidInputError(
                f"{where} is longer than the model's window of {window} tokens and this server "
                "rejects instead of truncating; shorten it"
            )
        if not encoded[i].truncated:  # the tokenizer was exported without truncation: cannot cut safely
            raise InvalidInputError(f"{where} is longer than the model's window of {window} tokens")
    current().add_truncated(len(over))


@contextmanager
def tokenizing(metrics: Metrics, model: ServedModel) -> Iterator[None]:
    started = time.perf_counter()
    yield
    elapsed = time.perf_counter() - started
    metrics.for_model(model.name).tokenize_duration.observe(elapsed)
    current().add_tokenize(elapsed)


async def submit(model: ServedModel, item: Any, timeout_s: float) -> Any:
    """One item through the model's batcher; its queue and engine time go on the request's context."""
    assert model.batcher is not None  # encoder tasks only: generation runs on its own engine
    timing = ItemTiming()
    try:
        return await model.batcher.submit(item, timeout_s=timeout_s, timing=timing)
    finally:
        current().add_item(timing)


async def run_all(model: ServedModel, items: Sequence[Any], timeout_s: float) -> list[Any]:
    """Submit every item to the model's batcher; they may land in the same or in different batches."""
    if len(items) == 1:  # the common case: no task per item
        return [await submit(model, items[0], timeout_s)]
    assert model.batcher is not None
    try:
        model.batcher.check_room(len(items))
    except ValueError as e:
        raise InvalidInputError(f"this request needs {e} (DISTILSERVE_MAX_QUEUE)") from None
    return await all_or_none(submit(model, item, timeout_s) for item in items)


async def all_or_none(work: Iterable[Awaitable[T]]) -> list[T]:
    """Await them together; when one fails (429, 504) or the request is cancelled (client gone), cancel
    the rest and wait until they have left their queues: a request's work is never computed for nobody."""
    tasks = [asyncio.ensure_future(w) for w in work]
    try:
        return list(await asyncio.gather(*tasks))
    except BaseException:
        for task in tasks:
            task.cancel()
        await asyncio.wait(tasks)
        raise
