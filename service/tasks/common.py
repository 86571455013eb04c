"""What the task modules share: text limits, timing, running rows, the v2 adapters' helpers."""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any, Protocol, TypeVar

import numpy as np
from pydantic import BaseModel, ValidationError

from service.batch_policy import ItemTiming, QueueTooSmallError
from service.exchange import Exchange, Phase
from service.tasks.contract import Collaborators, Handler, InvalidInputError, TensorError, V2Job
from service.tokenization import EncodedText

if TYPE_CHECKING:
    from service.metrics import Metrics
    from service.served import Outputs, ServedModel

M = TypeVar("M", bound=BaseModel)
R = TypeVar("R")
TextOrPair = str | tuple[str, str]  # a text, or two read together (a cross-encoder's query and document)


class TextsRequest(Protocol):
    """A request of `inputs` (one text or a list) and `top_k` (classification, fill-mask)."""

    model: str | None
    version: int | None
    inputs: str | list[str]
    top_k: int
    cascade_threshold: float | None
    cascade_budget_ms: float | None


PerText = Callable[["ServedModel", Sequence[str], int, "Metrics", float, Exchange], Awaitable[list[R]]]


def per_text_endpoint(task: str, run: PerText[R]) -> Handler:
    """The handler of a task that answers each text on its own: one text -> its answer, a list -> a list.
    A student with a served teacher hands its unsure texts over (service.cascade)."""

    async def handle(body: TextsRequest, x: Exchange, c: Collaborators) -> R | list[R]:
        model = c.resolve(task, body.model, body.version, x)
        texts = c.texts(body.inputs, x)
        answer = answering(run, body.top_k, c.metrics, c.settings.request_timeout_s)
        rows = await c.pairs.answer(model, texts, answer, body.cascade_threshold, x, body.cascade_budget_ms)
        return rows[0] if isinstance(body.inputs, str) else rows

    return handle


def answering(
    run: PerText[R], top_k: int, metrics: Metrics, timeout_s: float
) -> Callable[[ServedModel, Sequence[str], Exchange], Awaitable[list[R]]]:
    """`run` as service.cascade calls it: any model of the pair, some of the texts, an exchange."""

    def answer(model: ServedModel, texts: Sequence[str], x: Exchange) -> Awaitable[list[R]]:
        return run(model, texts, top_k, metrics, timeout_s, x)

    return answer


def where(i: int, count: int, what: str = "input", labels: Sequence[str] | None = None) -> str:
    """How a message names text `i` of `count`: its label (the request's own field, e.g. documents[3]) where
    the texts reached the engine in another order than the request's, else by position."""
    if labels is not None:
        return labels[i]
    return f"{what} {i}" if count > 1 else f"the {what}"


def check_chars(
    texts: Sequence[str], x: Exchange, what: str = "input", labels: Sequence[str] | None = None
) -> None:
    """Refuse a text over the raw-character cap before tokenizing it: tokenizing is the costly part."""
    limit = x.limits.max_chars
    for i, text in enumerate(texts):
        if len(text) > limit:
            raise InvalidInputError(
                f"{where(i, len(texts), what, labels)} is {len(text)} characters, at most {limit}"
            )


def enforce_window(
    encoded: Sequence[EncodedText], window: int, x: Exchange, labels: Sequence[str] | None = None
) -> None:
    """Texts past the model's window: keep the truncated encoding or refuse, per the server's policy.

    The number truncated goes on the exchange, from which the HTTP layer tells the client."""
    over = [i for i, e in enumerate(encoded) if e.truncated or len(e) > window]
    for i in over:
        text = where(i, len(encoded), labels=labels)
        if x.limits.truncation == "reject":
            raise InvalidInputError(
                f"{text} is longer than the model's window of {window} tokens and this server "
                "rejects instead of truncating; shorten it"
            )
        if not encoded[i].truncated:  # the tokenizer was exported without truncation: cannot cut safely
            raise InvalidInputError(f"{text} is longer than the model's window of {window} tokens")
    x.add_truncated(len(over))


def fit_window(
    encoded: Sequence[EncodedText],
    window: int,
    x: Exchange,
    truncate: bool | None,
    labels: Sequence[str] | None = None,
) -> None:
    """TEI's `truncate`: None follows the server's policy (common.enforce_window); false refuses a text past
    the window, true keeps its truncated encoding."""
    if truncate is None:
        enforce_window(encoded, window, x, labels)
        return
    over = [i for i, e in enumerate(encoded) if e.truncated or len(e) > window]
    for i in over:
        text = where(i, len(encoded), labels=labels)
        if not truncate:
            raise InvalidInputError(
                f"{text} is longer than the model's window of {window} tokens; truncate: true cuts it"
            )
        if not encoded[i].truncated:  # the tokenizer was exported without truncation: cannot cut safely
            raise InvalidInputError(f"{text} is longer than the model's window of {window} tokens")
    x.add_truncated(len(over))


async def run_texts(
    model: ServedModel,
    texts: Sequence[TextOrPair],
    truncate: bool | None,
    metrics: Metrics,
    timeout_s: float,
    x: Exchange,
    labels: Sequence[str] | None = None,
) -> tuple[list[dict[str, np.ndarray]], int]:
    """Each text's (or pair's) graph outputs (checked, tokenized, fitted to the window by `fit_window`'s
    rule, batched by the engine) and the tokens they took. `labels`: what messages call each (default: by
    position). A pair is tokenized as one sequence of two segments, the longer cut first at the window."""
    for i, item in enumerate(texts):
        if not isinstance(item, str):
            named = where(i, len(texts), labels=labels)
            check_chars(item, x, labels=[f"{named}, text 1", f"{named}, text 2"])
    check_chars([t for t in texts if isinstance(t, str)], x, labels=_of_texts(texts, labels))
    with tokenizing(metrics, model, x):
        encoded = _encoded(model, texts)
    fit_window(encoded, model.encoder.max_length, x, truncate, labels)
    return await run_all(model, encoded, timeout_s, x), sum(len(e) for e in encoded)


def _of_texts(items: Sequence[TextOrPair], labels: Sequence[str] | None) -> list[str] | None:
    """The labels of the single texts among `items` (None: all are single texts, named by position)."""
    if all(isinstance(item, str) for item in items):
        return None if labels is None else list(labels)
    return [where(i, len(items), labels=labels) for i, item in enumerate(items) if isinstance(item, str)]


def _encoded(model: ServedModel, items: Sequence[TextOrPair]) -> list[EncodedText]:
    """Texts and pairs tokenized, in their order (each kind in one batch call)."""
    texts = [(i, item) for i, item in enumerate(items) if isinstance(item, str)]
    if len(texts) == len(items):
        return model.encoder.encode([text for _, text in texts])
    pairs = [(i, item) for i, item in enumerate(items) if not isinstance(item, str)]
    encoded: dict[int, EncodedText] = {}
    if texts:
        encoded.update(zip([i for i, _ in texts], model.encoder.encode([t for _, t in texts]), strict=True))
    encoded.update(zip([i for i, _ in pairs], model.encoder.encode_pairs([p for _, p in pairs]), strict=True))
    return [encoded[i] for i in range(len(items))]


@contextmanager
def tokenizing(metrics: Metrics, model: ServedModel, x: Exchange) -> Iterator[None]:
    started = time.perf_counter()
    yield
    elapsed = time.perf_counter() - started
    metrics.for_model(model.name).tokenize_duration.observe(elapsed)
    x.add_tokenize(elapsed)
    if x.phases is not None:
        x.phases.append(Phase("tokenize", started, started + elapsed, {"model": model.name}))


async def run_all(
    model: ServedModel, items: Sequence[EncodedText], timeout_s: float, x: Exchange
) -> list[Outputs]:
    """A request's sequences through the model's engine, all or none (they may share engine calls); their
    queue and engine time go on the exchange (and, for a sampled request, its phases)."""
    assert model.encoding is not None  # encoder tasks only: generation runs on its own engine
    timings: list[ItemTiming] = []
    sent = time.perf_counter()
    if x.start_by_s is not None:  # a budget (a cascade's teacher): rows not started by then are dropped
        timeout_s = max(0.0, min(timeout_s, x.start_by_s - time.monotonic()))
    try:
        traced = x.phases is not None
        return await model.encoding.run(items, timeout_s, timings, x.shadow, traced, x.priority)
    except QueueTooSmallError as e:
        raise InvalidInputError(f"this request needs {e} (DISTILSERVE_MAX_QUEUE)") from None
    finally:
        for timing in timings:
            x.add_item(timing)
        if x.phases is not None:
            trace_engine_work(model.name, sent, timings, x.phases)
        x.engine_done_s = time.perf_counter()


def trace_engine_work(model: str, sent: float, timings: Sequence[ItemTiming], phases: list[Phase]) -> None:
    """The queue wait (until the first of the request's rows started) and one phase per engine call its
    rows rode in, each with how many of its rows it carried and a link to the call's span (service.tracing).
    """
    started = [t for t in timings if t.queue_s is not None and t.run_s is not None]
    if not started:
        return
    phases.append(Phase("queue", sent, sent + min(t.queue_s or 0.0 for t in started), {"model": model}))
    calls: dict[int | None, list[ItemTiming]] = {}
    for t in started:
        calls.setdefault(t.batch, []).append(t)
    for batch, rows in calls.items():
        begin = sent + (rows[0].queue_s or 0.0)
        attributes: dict[str, str | int | float] = {"model": model, "rows": len(rows)}
        if batch is not None:
            attributes["batch"] = batch
        links = (rows[0].batch_span,) if rows[0].batch_span else ()
        phases.append(Phase("engine", begin, begin + (rows[0].run_s or 0.0), attributes, links))


# -- v2 adapters ------------------------------------------------------------------------------------------


def strings(values: Sequence[Any]) -> np.ndarray:
    """A BYTES tensor (numpy objects) of `values`."""
    array = np.empty(len(values), dtype=object)
    array[:] = list(values)
    return array


def answered_by(best: Sequence[Any]) -> np.ndarray:
    """The v2 MODEL tensor (contract.ANSWERED_BY): the model named by each input's best answer."""
    return strings([answer["model"] for answer in best])


def label_order(model: ServedModel) -> list[str]:
    labels = model.manifest.labels
    return [labels[i] for i in sorted(labels)]


def passed(job: V2Job, names: Sequence[str]) -> dict[str, Any]:
    """The request parameters among `names` that the client set."""
    return {k: job.parameters[k] for k in names if k in job.parameters}


def validated(
    schema: type[M], values: Mapping[str, Any], names: Mapping[str, str], index: int | None = None
) -> M:
    """Check v2 values with the /v1 request schema, so both protocols share one set of limits; errors name
    the v2 tensor (`names`: field -> tensor) or parameter."""
    try:
        return schema.model_validate(values)
    except ValidationError as e:
        parts = []
        for err in e.errors():
            loc = err["loc"]
            where = names.get(str(loc[-1]), f"parameters.{loc[-1]}") if loc else "request"
            positions = [p for p in loc if isinstance(p, int)] or ([index] if index is not None else [])
            if positions and not where.startswith("parameters."):
                where += f"[{positions[0]}]"
            parts.append(f"{where}: {str(err['msg']).removeprefix('Value error, ')}")
        raise TensorError("; ".join(parts)) from None
