"""Prompt -> tokens from the generation engine, whole or as a stream of events."""

from __future__ import annotations

from collections.abc import AsyncGenerator, AsyncIterator
from dataclasses import dataclass
from typing import TypedDict

from service.generation.engine import TokenStreams
from service.generation.sampling import SamplingParams
from service.generation.sequence import Sequence, TokenEvent
from service.metrics import Metrics
from service.processors.common import InvalidInputError, check_chars, tokenizing
from service.served import ServedModel


class Completion(TypedDict):
    generated_text: str
    tokens: int
    prompt_tokens: int
    finish_reason: str


@dataclass(frozen=True)
class Prepared:
    engine: TokenStreams
    prompt: list[int]
    params: SamplingParams


def prepare(
    model: ServedModel, prompt: str, params: SamplingParams, truncate_prompt: bool, metrics: Metrics
) -> Prepared:
    """Tokenize; keep the prompt inside the window and the engine's cache budget (422, or its last tokens
    when asked); cap the output to the room both leave, so the engine's admission never refuses it."""
    if model.generator is None:
        raise InvalidInputError(f"model {model.name!r} serves {model.manifest.task}, not text-generation")
    check_chars([prompt], "prompt")
    with tokenizing(metrics, model):
        ids = [int(t) for t in model.encoder.encode_untruncated(prompt).input_ids]
    if not ids:
        raise InvalidInputError("the prompt encodes to no tokens")
    window, budget = model.manifest.max_sequence_length, model.generator.max_cached_tokens
    ids = _fit_prompt(ids, window, budget, truncate_prompt)
    room = min(window, budget) - len(ids)
    if params.max_new_tokens > room:
        params = SamplingParams(**{**params.__dict__, "max_new_tokens": room})
    return Prepared(model.generator, ids, params)


def _fit_prompt(ids: list[int], window: int, budget: int, truncate: bool) -> list[int]:
    """The prompt, or its end, leaving room for at least one new token in the window and in the budget
    (the cached positions one request may reserve: prompt + max_new_tokens)."""
    limit = min(window, budget)
    if len(ids) < limit:
        return ids
    if truncate and limit > 1:
        return ids[-(limit - 1) :]
    if len(ids) >= window:
        raise InvalidInputError(
            f"the prompt is {len(ids)} tokens; the model's window is {window} tokens "
            "(shorten it, or set truncate_prompt to keep its end)"
        )
    raise InvalidInputError(
        f"the prompt is {len(ids)} tokens; this server caches at most {budget} tokens for a request, prompt "
        "and new tokens together (DISTILSERVE_GEN_MAX_CACHED_TOKENS raises it; or shorten the prompt, or "
        "set truncate_prompt to keep its end)"
    )


async def complete(prepared: Prepared) -> Completion:
    seq, text = await prepared.engine.generate(prepared.prompt, prepared.params)
    return Completion(
        generated_text=text,
        tokens=seq.streamed,
        prompt_tokens=len(seq.prompt),
        finish_reason=seq.finish_reason or "length",
    )


async def open_stream(prepared: Prepared) -> tuple[Sequence, AsyncIterator[list[TokenEvent]]]:
    """Queue the request and wait for its first tokens, so that a refusal (429, 503) is still a status code
    before any byte is sent; then its events, in the groups the engine's stream interval hands them out in
    (one write each)."""
    seq = prepared.engine.submit(prepared.prompt, prepared.params)
    groups = prepared.engine.stream_groups(seq)
    try:
        first = await anext(groups)
    except BaseException:
        await groups.aclose()
        raise
    return seq, _prepend(first, groups)


async def _prepend(
    first: list[TokenEvent], rest: AsyncGenerator[list[TokenEvent], None]
) -> AsyncIterator[list[TokenEvent]]:
    try:
        yield first
        async for group in rest:
            yield group
    finally:
        await rest.aclose()
