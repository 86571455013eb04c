"""What every processor shares: the request error type, the text limits, timing, running a request's rows."""

from __future__ import annotations

import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager

from service.batching import ItemTiming, QueueTooSmallError, all_or_none
from service.metrics import Metrics
from service.request_context import current
from service.served import Outputs, ServedModel
from service.tokenization import EncodedText

__all__ = ["InvalidInputError", "all_or_none", "check_chars", "enforce_window", "run_all", "tokenizing"]


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


async def run_all(model: ServedModel, items: Sequence[EncodedText], timeout_s: float) -> list[Outputs]:
    """A request's sequences through the model's engine, all or none (they may share engine calls); their
    queue and engine time go on the request's context."""
    assert model.encoding is not None  # encoder tasks only: generation runs on its own engine
    timings: list[ItemTiming] = []
    try:
        return await model.encoding.run(items, timeout_s, timings)
    except QueueTooSmallError as e:
        raise InvalidInputError(f"this request needs {e} (DISTILSERVE_MAX_QUEUE)") from None
    finally:
        context = current()
        for timing in timings:
            context.add_item(timing)
