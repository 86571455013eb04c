"""Text generation: a prompt -> tokens from the generation engine, whole or streamed as Server-Sent Events.

`POST /v1/generate`, OpenAI's `POST /v1/completions`; v2: PROMPT BYTES [b] -> TEXT BYTES [b], TOKENS INT64
[b], FINISH_REASON BYTES [b], parameters max_new_tokens (default 32) and the sampling fields of
/v1/generate. The engine runs its own scheduler (continuous batching); this module tokenizes, fits the
prompt to the window and the cache budget, and shapes the events.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
import uuid
from collections.abc import AsyncGenerator, AsyncIterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Annotated, Any

import numpy as np
from pydantic import BaseModel, BeforeValidator, ConfigDict, Field, model_validator
from typing_extensions import TypedDict  # pydantic reads only this one's fields on Python 3.11

from service.batching import DeadlineExceededError, all_or_none
from service.exchange import Exchange
from service.generation.engine import TokenStreams
from service.generation.sampling import SamplingParams
from service.generation.sequence import Sequence, TokenEvent
from service.tasks.common import check_chars, passed, strings, tokenizing, validated
from service.tasks.contract import (
    Collaborators,
    Endpoint,
    EventStream,
    InvalidInputError,
    ModelRequest,
    ServedTask,
    V2Interface,
    V2Job,
    tensor,
)

if TYPE_CHECKING:
    from service.metrics import Metrics
    from service.served import ServedModel

log = logging.getLogger(__name__)
NAME = "text-generation"
OPENAI_FINISH = {"eos": "stop", "stop": "stop", "length": "length"}


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
    seed: int | None = Field(None, ge=0, description="Makes sampling reproducible.")
    stop: Stops = Field((), description="Stop before any of these strings (not included in the text).")
    truncate_prompt: bool = Field(
        False, description="Keep the prompt's end when it exceeds the window (or the server's cache budget)."
    )
    ignore_eos: bool = Field(
        False,
        description="Go on past the end-of-sequence token up to the token limit (as vLLM's, for benchmarks).",
    )

    def sampling(self, max_new_tokens: int) -> SamplingParams:
        return SamplingParams(
            max_new_tokens=max_new_tokens,
            temperature=self.temperature,
            top_k=self.top_k,
            top_p=self.top_p,
            repetition_penalty=self.repetition_penalty,
            seed=self.seed,
            stop=self.stop,
            ignore_eos=self.ignore_eos,
        )


class GenerateRequest(ModelRequest, SamplingFields):
    prompt: str = Field(..., min_length=1, examples=["The film was"])
    max_new_tokens: int = Field(32, ge=1, le=4096, description="Most tokens to generate.")
    stream: bool = Field(False, description="Server-Sent Events: one event per token, then a final one.")


def _completion_prompt(value: Any) -> str | list[str]:
    """One clear message per wrong shape before the union is tried (its per-branch errors are noise);
    OpenAI also takes token ids, which this server does not."""
    if isinstance(value, list):
        if any(isinstance(x, list) or (isinstance(x, int) and not isinstance(x, bool)) for x in value):
            raise ValueError("token-id prompts are not supported; send the prompt as text")
        if len(value) != 1:
            raise ValueError("give one string (batches of prompts are not supported)")
        text = value[0]
    else:
        text = value
    if not isinstance(text, str):
        raise ValueError(f"expected a string (or a list holding one string), got {type(text).__name__}")
    if not text.strip():
        raise ValueError("the text is empty")
    return value


CompletionPrompt = Annotated[str | list[str], BeforeValidator(_completion_prompt)]


class CompletionRequest(SamplingFields):
    """OpenAI's /v1/completions request (the fields this server implements; others are ignored).

    Strict as OpenAI's API is: booleans must be JSON booleans, numbers JSON numbers ("0.5" or true as a
    temperature or a seed is an error, not a value).
    """

    model_config = ConfigDict(extra="ignore", strict=True)

    model: str | None = None
    prompt: CompletionPrompt = Field(..., description="A string (or a list holding one string).")
    max_tokens: int = Field(16, ge=1, le=4096)
    temperature: float = Field(1.0, ge=0.0, le=5.0)
    n: int = Field(1, ge=1, le=1, description="Only 1 is supported.")
    stream: bool = False
    stream_options: dict[str, Any] | None = None
    echo: bool = Field(False, description="Not supported: must be false.")
    # OpenAI's other knobs this server does not implement: refused when set, never silently ignored.
    logprobs: int | None = Field(None, description="Not supported: must be null.")
    best_of: int | None = Field(None, description="Not supported: null or 1.")
    suffix: str | None = Field(None, description="Not supported: must be null.")
    logit_bias: dict[str, float] | None = Field(None, description="Not supported: null or empty.")
    presence_penalty: float = Field(0.0, description="Not supported: must be 0 (see repetition_penalty).")
    frequency_penalty: float = Field(0.0, description="Not supported: must be 0 (see repetition_penalty).")

    @model_validator(mode="after")
    def _unsupported(self) -> CompletionRequest:
        unsupported = [
            name
            for name, is_set in (
                ("echo", self.echo),
                ("logprobs", self.logprobs is not None),
                ("best_of", self.best_of not in (None, 1)),
                ("suffix", self.suffix is not None),
                ("logit_bias", bool(self.logit_bias)),
                ("presence_penalty", self.presence_penalty != 0),
                ("frequency_penalty", self.frequency_penalty != 0),
            )
            if is_set
        ]
        if unsupported:
            raise ValueError(f"not supported by this server: {', '.join(unsupported)}")
        return self

    @property
    def text(self) -> str:
        return self.prompt if isinstance(self.prompt, str) else self.prompt[0]


class GenerateResponse(TypedDict):
    generated_text: str
    tokens: Annotated[
        int, Field(description="Tokens generated (the eos token included when it ended the text).")
    ]
    finish_reason: Annotated[str, Field(description="length | eos | stop")]


# -- the engine -------------------------------------------------------------------------------------------


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
    model: ServedModel,
    prompt: str,
    params: SamplingParams,
    truncate_prompt: bool,
    metrics: Metrics,
    x: Exchange,
) -> Prepared:
    """Tokenize; keep the prompt inside the window and the engine's cache budget (422, or its last tokens
    when asked); cap the output to the room both leave, so the engine's admission never refuses it."""
    if model.generator is None:
        raise InvalidInputError(f"model {model.name!r} serves {model.manifest.task}, not text-generation")
    check_chars([prompt], x, "prompt")
    with tokenizing(metrics, model, x):
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


# -- /v1/generate -----------------------------------------------------------------------------------------


def sse(payload: dict[str, Any] | str) -> bytes:
    data = payload if isinstance(payload, str) else json.dumps(payload, separators=(",", ":"))
    return f"data: {data}\n\n".encode()


def stream_failed(x: Exchange, error: Exception) -> None:
    """A stream that fails after its first event: its 200 is sent, so the exchange carries the error, which
    the request metrics count as a 500 and the access line shows (service.api.access)."""
    x.stream_error = str(error) or type(error).__name__
    log.error("a stream failed after it started: %s", error)


async def handle_generate(
    body: GenerateRequest, x: Exchange, c: Collaborators
) -> GenerateResponse | EventStream:
    model = c.resolve(NAME, body.model, body.version, x)
    params = body.sampling(body.max_new_tokens)
    prepared = prepare(model, body.prompt, params, body.truncate_prompt, c.metrics, x)
    if not body.stream:
        result = await complete(prepared)
        return GenerateResponse(
            generated_text=result["generated_text"],
            tokens=result["tokens"],
            finish_reason=result["finish_reason"],
        )
    return EventStream(_generate_events(*await open_stream(prepared), x))  # opened first: a 429 stays one


async def _generate_events(
    seq: Sequence, groups: AsyncIterator[list[TokenEvent]], x: Exchange
) -> AsyncIterator[bytes]:
    text = []
    try:
        async for group in groups:
            chunk = []
            for event in group:
                text.append(event.text)
                chunk.append(sse({"index": event.index, "token": event.token_id, "text": event.text}))
                if event.finish_reason is not None:
                    final = {"finish_reason": event.finish_reason, "generated_text": "".join(text)}
                    chunk.append(sse(final | {"tokens": seq.streamed}))
            yield b"".join(chunk)
    except Exception as e:  # the stream has started: the error travels as an event
        stream_failed(x, e)
        yield sse({"error": str(e), "error_type": "backend"})


# -- OpenAI's /v1/completions -----------------------------------------------------------------------------


async def handle_completions(body: CompletionRequest, x: Exchange, c: Collaborators) -> Any:
    model = c.resolve(NAME, body.model, None, x)
    prepared = prepare(model, body.text, body.sampling(body.max_tokens), body.truncate_prompt, c.metrics, x)
    completion_id = f"cmpl-{uuid.uuid4().hex}"
    created = int(time.time())
    if body.stream:
        usage = bool((body.stream_options or {}).get("include_usage"))
        seq, groups = await open_stream(prepared)  # a 429 is still a 429
        return EventStream(_completion_chunks(seq, groups, completion_id, created, model.name, usage, x))
    result = await complete(prepared)
    return {
        "id": completion_id,
        "object": "text_completion",
        "created": created,
        "model": model.name,
        "choices": [
            {
                "index": 0,
                "text": result["generated_text"],
                "logprobs": None,
                "finish_reason": OPENAI_FINISH[result["finish_reason"]],
            }
        ],
        "usage": _usage(result["prompt_tokens"], result["tokens"]),
    }


def _usage(prompt_tokens: int, completion_tokens: int) -> dict[str, int]:
    return {
        "prompt_tokens": prompt_tokens,
        "completion_tokens": completion_tokens,
        "total_tokens": prompt_tokens + completion_tokens,
    }


async def _completion_chunks(
    seq: Sequence,
    groups: AsyncIterator[list[TokenEvent]],
    completion_id: str,
    created: int,
    model: str,
    include_usage: bool,
    x: Exchange,
) -> AsyncIterator[bytes]:
    def chunk(text: str, finish: str | None) -> dict[str, Any]:
        choice = {"index": 0, "text": text, "logprobs": None, "finish_reason": finish}
        return {
            "id": completion_id,
            "object": "text_completion",
            "created": created,
            "model": model,
            "choices": [choice],
        }

    try:
        async for group in groups:
            yield b"".join(
                sse(chunk(e.text, OPENAI_FINISH[e.finish_reason] if e.finish_reason else None)) for e in group
            )
        if include_usage:
            final = chunk("", None) | {"choices": [], "usage": _usage(len(seq.prompt), seq.streamed)}
            yield sse(final)
    except Exception as e:  # the stream has started: the error travels as an event
        stream_failed(x, e)
        yield sse({"error": {"message": str(e), "type": "server_error"}})
    yield sse("[DONE]")


# -- v2 ---------------------------------------------------------------------------------------------------


async def infer(job: V2Job) -> dict[str, np.ndarray]:
    given = passed(job, TASK.v2.parameters)
    bodies = [
        validated(GenerateRequest, {"prompt": p, **given}, {"prompt": "PROMPT"}, index=i)
        for i, p in enumerate(job.texts["PROMPT"])
    ]
    prepared = [
        prepare(job.model, b.prompt, b.sampling(b.max_new_tokens), b.truncate_prompt, job.c.metrics, job.x)
        for b in bodies
    ]
    work = all_or_none(complete(p) for p in prepared)
    if "timeout" not in job.parameters:  # as /v1/generate: no deadline unless the client sets one
        results = await work
    else:
        try:
            results = await asyncio.wait_for(work, job.timeout_s)
        except TimeoutError:
            raise DeadlineExceededError(f"not finished within {job.timeout_s:g} s") from None
    return {
        "TEXT": strings([r["generated_text"] for r in results]),
        "TOKENS": np.array([r["tokens"] for r in results], dtype=np.int64),
        "FINISH_REASON": strings([r["finish_reason"] for r in results]),
    }


TASK = ServedTask(
    name=NAME,
    endpoints=(
        Endpoint(
            "/v1/generate",
            GenerateRequest,
            GenerateResponse,
            "Continue a prompt; with stream=true, one SSE event per token and a final event.",
            handle_generate,
            tags=("generation",),
        ),
        Endpoint(
            "/v1/completions",
            CompletionRequest,
            None,  # OpenAI's completion object, built as a dict
            "OpenAI-compatible text completions.",
            handle_completions,
            errors="openai",
            tags=("generation",),
        ),
    ),
    v2=V2Interface(
        inputs=("PROMPT",),
        outputs=(tensor("TEXT", "BYTES"), tensor("TOKENS", "INT64"), tensor("FINISH_REASON", "BYTES")),
        parameters=(
            "max_new_tokens",
            "temperature",
            "top_k",
            "top_p",
            "repetition_penalty",
            "seed",
            "stop",
            "truncate_prompt",
        ),
        run=infer,
    ),
)
