"""What the generation endpoints share (/v1/generate, OpenAI's completions and chat completions, v2): the
sampling fields, fitting a prompt to the window and the cache budget, the engine calls, Server-Sent Events.

The engine runs its own scheduler (continuous batching); the endpoints tokenize, fit the prompt, and shape
the events the engine's token groups become. The engine's text events never end mid-character (its
detokenizer holds back a character's first bytes until the token completing it arrives), so every endpoint
streams whole characters.

A sampled request (service.tracing) gets two phases per prompt once its sequence ends (`generation_phases`):
`prefill`, from submission to the first token (the wait for a slot, the prefill step and, across processes,
the hop), and `decode`, from the first token to the last, with the number of tokens, how it finished, and a
`token` event per later token as the stream received it, up to the `TRACED_TOKENS`th (32; a long output
would make a span of thousands of events: the count and the span's length tell the rest).
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import AsyncGenerator, AsyncIterator, Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Annotated, Any

from pydantic import BaseModel, BeforeValidator, Field
from typing_extensions import TypedDict  # pydantic reads only this one's fields on Python 3.11

from service.batching import all_or_none
from service.exchange import Attribute, Event, Exchange, Phase
from service.generation.engine import TokenStreams
from service.generation.sampling import SamplingParams
from service.generation.sequence import Sequence, TokenEvent
from service.tasks.common import check_chars, tokenizing
from service.tasks.contract import InvalidInputError

if TYPE_CHECKING:
    from service.metrics import Metrics
    from service.served import ServedModel

log = logging.getLogger(__name__)
NAME = "text-generation"


# -- requests ---------------------------------------------------------------------------------------------


def _stops(value: Any) -> tuple[str, ...]:
    """The error formatter already names the field: the messages must not repeat "stop:"."""
    if value is None:
        return ()
    stops = [value] if isinstance(value, str) else value
    if not isinstance(stops, list) or not all(isinstance(x, str) and x for x in stops):
        raise ValueError("expected a non-empty string or a list of non-empty strings")
    if len(stops) > 8:
        raise ValueError("at most 8 stop sequences")
    return tuple(stops)


Stops = Annotated[tuple[str, ...], BeforeValidator(_stops)]


class SamplingFields(BaseModel):
    """Decoding knobs shared by /v1/generate and /v1/completions."""

    temperature: float = Field(0.0, ge=0.0, le=5.0, description="0 (or below 1e-5): greedy.")
    top_k: int = Field(0, ge=0, le=1000, description="Sample among the k most likely tokens; 0: all.")
    top_p: float = Field(1.0, gt=0.0, le=1.0, description="Nucleus sampling mass.")
    repetition_penalty: float = Field(1.0, gt=0.0, le=10.0, description="> 1 discourages repeats (HF).")
    presence_penalty: float = Field(
        0.0,
        ge=-2.0,
        le=2.0,
        description="Taken once from the logit of every token the output holds (OpenAI's).",
    )
    frequency_penalty: float = Field(
        0.0,
        ge=-2.0,
        le=2.0,
        description="Taken from a token's logit per time the output holds it (OpenAI's).",
    )
    seed: int | None = Field(None, ge=0, le=2**63 - 1, description="Makes sampling reproducible (an int64).")
    stop: Stops = Field((), description="Stop before any of these strings (not included in the text).")
    stop_token_ids: list[int] = Field(
        default_factory=list,
        max_length=64,
        description="vLLM's: these tokens end the output too (kept in it).",
    )
    min_tokens: int = Field(
        0,
        ge=0,
        le=4096,
        description="vLLM's: no stop token and no stop string ends the output before this many.",
    )
    truncate_prompt: bool = Field(
        False, description="Keep the prompt's end when it exceeds the window (or the server's cache budget)."
    )
    ignore_eos: bool = Field(
        False,
        description="Go on past the end-of-sequence token up to the token limit (as vLLM's, for benchmarks).",
    )

    def sampling(self, max_new_tokens: int, logprobs: int | None = None) -> SamplingParams:
        return SamplingParams(
            max_new_tokens=max_new_tokens,
            temperature=self.temperature,
            top_k=self.top_k,
            top_p=self.top_p,
            repetition_penalty=self.repetition_penalty,
            presence_penalty=self.presence_penalty,
            frequency_penalty=self.frequency_penalty,
            seed=self.seed,
            stop=self.stop,
            stop_token_ids=tuple(self.stop_token_ids),
            min_tokens=self.min_tokens,
            ignore_eos=self.ignore_eos,
            logprobs=logprobs,
        )


# -- the engine -------------------------------------------------------------------------------------------


class Completion(TypedDict):
    generated_text: str
    tokens: int
    prompt_tokens: int
    cached_tokens: int  # of them, read from the prefix cache
    finish_reason: str


@dataclass(frozen=True)
class Prepared:
    engine: TokenStreams
    prompt: list[int]
    params: SamplingParams
    model: str = ""
    phases: list[Phase] | None = None  # a sampled request's (its exchange's): its generation phases go there
    on_done: Callable[[Sequence], None] | None = None  # a finished answer (not one its client left): shadow


def prepare(
    model: ServedModel,
    prompt: str | list[int],
    params: SamplingParams,
    truncate_prompt: bool,
    metrics: Metrics,
    x: Exchange,
    rendered: bool = False,
) -> Prepared:
    """Tokenize (a prompt given as token ids is taken as it is, each checked against the vocabulary); keep
    the prompt inside the window and the engine's cache budget (422, or its last tokens when asked); cap the
    output to the room both leave, so the engine's admission never refuses it.

    `rendered`: the prompt is a chat template's output, which holds its special tokens already (the
    tokenizer must not add a BOS again, as `apply_chat_template` does not)."""
    if model.generator is None:
        raise InvalidInputError(f"model {model.name!r} serves {model.manifest.task}, not text-generation")
    vocab = model.encoder.vocab_size
    if any(not 0 <= t < vocab for t in params.stop_token_ids):
        raise InvalidInputError(f"stop_token_ids must be in [0, {vocab}): the vocabulary of {model.name!r}")
    if params.min_tokens > params.max_new_tokens:
        raise InvalidInputError(
            f"min_tokens ({params.min_tokens}) is more than the tokens asked for ({params.max_new_tokens})"
        )
    if any(t >= vocab for t, _ in params.logit_bias):
        raise InvalidInputError(
            f"logit_bias: token ids must be in [0, {vocab}): the vocabulary of {model.name!r}"
        )
    if isinstance(prompt, list):
        ids = prompt
        if any(not 0 <= t < vocab for t in ids):
            raise InvalidInputError(f"token ids must be in [0, {vocab}): the vocabulary of {model.name!r}")
    else:
        check_chars([prompt], x, "rendered chat prompt" if rendered else "prompt")
        with tokenizing(metrics, model, x):
            encoded = model.encoder.encode_untruncated(prompt, add_special_tokens=not rendered)
            ids = [int(t) for t in encoded.input_ids]
    if not ids:
        raise InvalidInputError("the prompt encodes to no tokens")
    window, budget = model.manifest.max_sequence_length, model.generator.max_cached_tokens
    ids = _fit_prompt(ids, window, budget, truncate_prompt)
    room = min(window, budget) - len(ids)
    if params.max_new_tokens > room:
        params = SamplingParams(**{**params.__dict__, "max_new_tokens": room})
    return Prepared(model.generator, ids, params, model.name, x.phases)


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


async def complete(prepared: Prepared, on_event: Callable[[TokenEvent], None] | None = None) -> Completion:
    """The whole answer (`on_event` sees each token's event on the way: its log-probabilities, say)."""
    traced = prepared.phases is not None
    seq, text = await prepared.engine.generate(prepared.prompt, prepared.params, traced, on_event)
    trace_generation(prepared, seq)
    finished(prepared, seq)
    return Completion(
        generated_text=text,
        tokens=seq.streamed,
        prompt_tokens=len(seq.prompt),
        cached_tokens=seq.cached_tokens,
        finish_reason=seq.finish_reason or "length",
    )


async def open_stream(prepared: Prepared) -> tuple[Sequence, AsyncIterator[list[TokenEvent]]]:
    """Queue the request and wait for its first tokens, so that a refusal (429, 503) is still a status code
    before any byte is sent; then its events, in the groups the engine's stream interval hands them out in
    (one write each)."""
    seq = prepared.engine.submit(prepared.prompt, prepared.params, prepared.phases is not None)
    groups = prepared.engine.stream_groups(seq)
    try:
        first = await anext(groups)
    except BaseException:
        await groups.aclose()
        raise
    return seq, _prepend(first, groups, prepared, seq)


async def open_streams(prepared: list[Prepared]) -> list[tuple[Sequence, AsyncIterator[list[TokenEvent]]]]:
    """Every prompt's stream opened together (their first tokens in); if one is refused, those opened are
    closed (their sequences freed) and the refusal raised."""
    opened: list[AsyncIterator[list[TokenEvent]]] = []

    async def open_one(p: Prepared) -> tuple[Sequence, AsyncIterator[list[TokenEvent]]]:
        seq, groups = await open_stream(p)
        opened.append(groups)
        return seq, groups

    try:
        return await all_or_none(open_one(p) for p in prepared)
    except BaseException:
        for groups in opened:
            await groups.aclose()  # type: ignore[attr-defined]
        raise


async def merged_streams(
    streams: list[AsyncIterator[list[TokenEvent]]],
) -> AsyncIterator[tuple[int, list[TokenEvent]]]:
    """The streams' groups as they come, each with its stream's place; one stream is read as it is."""
    if len(streams) == 1:
        try:
            async for group in streams[0]:
                yield 0, group
        finally:
            await streams[0].aclose()  # type: ignore[attr-defined]
        return
    pending = {asyncio.ensure_future(anext(stream)): i for i, stream in enumerate(streams)}
    try:
        while pending:
            done, _ = await asyncio.wait(pending, return_when=asyncio.FIRST_COMPLETED)
            for task in done:
                i = pending.pop(task)
                try:
                    group = task.result()
                except StopAsyncIteration:
                    continue
                yield i, group
                pending[asyncio.ensure_future(anext(streams[i]))] = i
    finally:
        for task in pending:
            task.cancel()
        await asyncio.gather(*pending, return_exceptions=True)
        for stream in streams:
            await stream.aclose()  # type: ignore[attr-defined]


async def _prepend(
    first: list[TokenEvent], rest: AsyncGenerator[list[TokenEvent], None], prepared: Prepared, seq: Sequence
) -> AsyncIterator[list[TokenEvent]]:
    try:
        yield first
        async for group in rest:
            yield group
    finally:
        await rest.aclose()
        trace_generation(prepared, seq)  # the stream ended (or its client left): before the request's spans
        finished(prepared, seq)


def finished(prepared: Prepared, seq: Sequence) -> None:
    """Tell `prepared.on_done` of an answer that ended as the model ended it (not left, not failed)."""
    if prepared.on_done is not None and seq.finish_reason is not None and seq.error is None:
        prepared.on_done(seq)


async def text_pieces(groups: AsyncIterator[list[TokenEvent]]) -> AsyncIterator[tuple[str, int, str | None]]:
    """Each group of a stream's events as (its text, tokens generated so far, how the sequence ended: None
    until the last group): what a protocol that streams text pieces sends (v2's generate extension, gRPC)."""
    tokens = 0
    async for group in groups:
        tokens += sum(e.token_id is not None for e in group)
        finish = next((e.finish_reason for e in group if e.finish_reason is not None), None)
        yield "".join(e.text for e in group), tokens, finish


def trace_generation(prepared: Prepared, seq: Sequence) -> None:
    """A sampled request's phases of one sequence (see the module's docstring); nothing otherwise."""
    if prepared.phases is not None:
        prepared.phases.extend(generation_phases(seq, prepared.model))


def generation_phases(seq: Sequence, model: str) -> list[Phase]:
    """`prefill` and `decode` of a sequence that kept its token times (none before its first token)."""
    times = seq.token_times
    if not times:
        return []
    first, last = times[0], seq.last_token_at or times[0]
    events: tuple[Event, ...] = tuple(("token", at, {"index": i}) for i, at in enumerate(times[1:], 1))
    decode: dict[str, Attribute] = {
        "model": model,
        "tokens": seq.streamed,
        "finish_reason": seq.finish_reason or "aborted",
        "token_events": len(events),  # at most TRACED_TOKENS - 1: the first token ends the prefill
    }
    return [
        Phase("prefill", seq.arrived_at, first, {"model": model, "prompt_tokens": len(seq.prompt)}),
        Phase("decode", first, last, decode, events=events),
    ]


# -- Server-Sent Events -----------------------------------------------------------------------------------


def sse(payload: dict[str, Any] | str) -> bytes:
    data = payload if isinstance(payload, str) else json.dumps(payload, separators=(",", ":"))
    return f"data: {data}\n\n".encode()


def stream_failed(x: Exchange, error: Exception) -> None:
    """A stream that fails after its first event: its 200 is sent, so the exchange carries the error, which
    the request metrics count as a 500 and the access line shows (service.api.access)."""
    x.stream_error = str(error) or type(error).__name__
    log.error("a stream failed after it started: %s", error)
