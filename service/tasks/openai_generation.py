"""OpenAI's generation endpoints: `POST /v1/completions` and `POST /v1/chat/completions`.

Both are one path: a prompt (given, or rendered from chat messages with the model's chat template,
service.tasks.chat_template) goes through the generation endpoints' shared preparation and engine calls
(service.tasks.generation_base); only the answer's shape differs (`text_completion` with `text`,
`chat.completion` with `message`, and their stream chunks). Errors are in OpenAI's shape (the route's
`errors="openai"`), so the official client's `completions.create` and `chat.completions.create` work, whole
and streamed, `usage` and `logprobs` included (service.tasks.openai_logprobs).
"""

from __future__ import annotations

import asyncio
import dataclasses
import time
import uuid
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from typing import Annotated, Any, Literal

from pydantic import BaseModel, BeforeValidator, ConfigDict, Field, model_validator

from service.batching import all_or_none
from service.exchange import Exchange
from service.generation.sampling import SamplingParams
from service.generation.sequence import Sequence, TokenEvent
from service.tasks.chat_template import ChatTemplateError
from service.tasks.contract import Collaborators, EventStream, InvalidInputError
from service.tasks.generation_base import (
    NAME,
    Completion,
    Prepared,
    SamplingFields,
    complete,
    open_stream,
    prepare,
    sse,
    stream_failed,
)
from service.tasks.openai_logprobs import LogprobWriter

OPENAI_FINISH = {"eos": "stop", "stop": "stop", "length": "length"}
MAX_PROMPTS = 64  # prompts one completions request may carry (each one a choice, all decoded together)
MAX_N = 16  # answers per prompt (OpenAI's `n`)
MAX_CHOICES = 64  # prompts x n in one request


# -- requests ---------------------------------------------------------------------------------------------


class OpenAIRequest(SamplingFields):
    """What OpenAI's completions and chat completions requests share (the fields this server implements).

    Strict as OpenAI's API is: booleans must be JSON booleans, numbers JSON numbers ("0.5" or true as a
    temperature or a seed is an error, not a value). Unknown fields are ignored (`user`, `metadata`, ...);
    OpenAI's knobs this server does not implement are refused when set, never silently ignored.
    """

    model_config = ConfigDict(extra="ignore", strict=True)

    model: str | None = None
    temperature: float = Field(1.0, ge=0.0, le=5.0)
    n: int = Field(
        1,
        ge=1,
        le=MAX_N,
        description="Answers per prompt (choice i * n + j: prompt i's j-th); with a seed, the j-th samples "
        "with seed + j.",
    )
    stream: bool = False
    stream_options: dict[str, Any] | None = None
    logit_bias: dict[str, float] | None = Field(None, description="Not supported: null or empty.")
    presence_penalty: float = Field(0.0, description="Not supported: must be 0 (see repetition_penalty).")
    frequency_penalty: float = Field(0.0, description="Not supported: must be 0 (see repetition_penalty).")

    def unsupported(self) -> list[tuple[str, bool]]:
        """(field, whether it is set to something this server cannot do); subclasses add theirs."""
        return [
            ("logit_bias", bool(self.logit_bias)),
            ("presence_penalty", self.presence_penalty != 0),
            ("frequency_penalty", self.frequency_penalty != 0),
        ]

    @model_validator(mode="after")
    def _refuse_unsupported(self) -> OpenAIRequest:
        names = [name for name, is_set in self.unsupported() if is_set]
        if names:
            raise ValueError(f"not supported by this server: {', '.join(names)}")
        return self

    @property
    def include_usage(self) -> bool:
        return bool((self.stream_options or {}).get("include_usage"))

    def samples(self, params: SamplingParams) -> list[SamplingParams]:
        """The n answers' sampling: the j-th with seed + j when a seed is given (each reproducible)."""
        if params.seed is None:
            return [params] * self.n
        return [dataclasses.replace(params, seed=(params.seed + j) % 2**63) for j in range(self.n)]


def _completion_prompt(value: Any) -> str | list[str]:
    """One clear message per wrong shape before the union is tried (its per-branch errors are noise);
    OpenAI also takes token ids, which this server does not."""
    texts = value if isinstance(value, list) else [value]
    if any(isinstance(x, list) or (isinstance(x, int) and not isinstance(x, bool)) for x in texts):
        raise ValueError("token-id prompts are not supported; send the prompt as text")
    if not 1 <= len(texts) <= MAX_PROMPTS:
        raise ValueError(f"give a string or a list of 1 to {MAX_PROMPTS} strings, not {len(texts)}")
    for i, text in enumerate(texts):
        at = f" (prompt {i})" if isinstance(value, list) else ""
        if not isinstance(text, str):
            raise ValueError(f"expected a string (or a list of strings), got {type(text).__name__}{at}")
        if not text.strip():
            raise ValueError(f"the text is empty{at}")
    return value


CompletionPrompt = Annotated[str | list[str], BeforeValidator(_completion_prompt)]


class CompletionRequest(OpenAIRequest):
    """OpenAI's /v1/completions request."""

    prompt: CompletionPrompt = Field(
        ..., description=f"A string, or a list of up to {MAX_PROMPTS}: one choice each (`index`: its place)."
    )
    max_tokens: int = Field(16, ge=1, le=4096)
    echo: bool = Field(
        False,
        description="The prompt first in the answer's text, and with logprobs its tokens' log-probabilities "
        "first (the first token's null): how a client scores a text.",
    )
    logprobs: int | None = Field(
        None,
        ge=0,
        le=5,
        description="Each token's log-probability (under the model's own distribution, before temperature, "
        "penalty, top-k and top-p) and this many most likely alternatives'.",
    )
    best_of: int | None = Field(None, description="Not supported: null or 1.")
    suffix: str | None = Field(None, description="Not supported: must be null.")

    def unsupported(self) -> list[tuple[str, bool]]:
        mine = [
            ("best_of", self.best_of not in (None, 1)),
            ("suffix", self.suffix is not None),
        ]
        return mine + super().unsupported()

    @property
    def texts(self) -> list[str]:
        return [self.prompt] if isinstance(self.prompt, str) else self.prompt

    @model_validator(mode="after")
    def _choices_in_bounds(self) -> CompletionRequest:
        if len(self.texts) * self.n > MAX_CHOICES:
            raise ValueError(f"{len(self.texts)} prompts x n {self.n} is more than {MAX_CHOICES} choices")
        return self


def _message_content(value: Any) -> Any:
    """OpenAI's content parts (`[{"type": "text", "text": ...}]`) joined into the one string a chat
    template reads, as vLLM joins them for text-only models; any other part is refused by name."""
    if not isinstance(value, list):
        return value  # a string passes; anything else gets pydantic's "Input should be a valid string"
    if not value:
        raise ValueError("the list of content parts is empty")
    texts = []
    for i, part in enumerate(value):
        kind = part.get("type") if isinstance(part, dict) else type(part).__name__
        if kind != "text":
            raise ValueError(f"part {i} is {kind!r}: only text parts are supported")
        if set(part) - {"type", "text"} or not isinstance(part.get("text"), str):
            raise ValueError(f'part {i}: a text part is {{"type": "text", "text": "..."}}')
        texts.append(part["text"])
    return "\n".join(texts)


class ChatMessage(BaseModel):
    """One message of the conversation; tool calls and non-text content are not supported."""

    model_config = ConfigDict(extra="forbid", strict=True)

    role: Literal["system", "user", "assistant", "developer"]
    content: Annotated[str, BeforeValidator(_message_content)] = Field(
        ..., description='A string, or a list of {"type": "text", "text": ...} parts.'
    )
    name: str | None = None


class ChatCompletionRequest(OpenAIRequest):
    """OpenAI's /v1/chat/completions request."""

    messages: list[ChatMessage] = Field(..., min_length=1)
    max_tokens: int | None = Field(None, ge=1, le=4096, description="Deprecated by OpenAI for the next.")
    max_completion_tokens: int | None = Field(
        None, ge=1, le=4096, description="Most tokens to generate; default: as many as the window leaves."
    )
    logprobs: bool | None = Field(
        None,
        description="Each token's log-probability, under the model's own distribution (before temperature, "
        "penalty, top-k and top-p).",
    )
    top_logprobs: int | None = Field(
        None, ge=0, le=20, description="With logprobs: this many most likely alternatives per token."
    )
    tools: list[Any] | None = Field(None, description="Not supported: null or empty.")
    tool_choice: Any = Field(None, description="Not supported: null or 'none'.")
    functions: list[Any] | None = Field(None, description="Not supported: must be null.")
    function_call: Any = Field(None, description="Not supported: must be null.")
    response_format: dict[str, Any] | None = Field(None, description='Only {"type": "text"}.')

    def unsupported(self) -> list[tuple[str, bool]]:
        mine = [
            ("tools", bool(self.tools)),
            ("tool_choice", self.tool_choice not in (None, "none")),
            ("functions", self.functions is not None),
            ("function_call", self.function_call is not None),
            ("response_format", (self.response_format or {"type": "text"}).get("type") != "text"),
        ]
        return mine + super().unsupported()

    @model_validator(mode="after")
    def _top_logprobs_need_logprobs(self) -> ChatCompletionRequest:
        if self.top_logprobs is not None and not self.logprobs:
            raise ValueError("top_logprobs needs logprobs: true")
        return self

    @property
    def alternatives(self) -> int | None:
        """The engine's `logprobs`: alternatives per token, or None where no log-probabilities are asked."""
        return (self.top_logprobs or 0) if self.logprobs else None

    def token_limit(self, window: int) -> int:
        """max_completion_tokens, else max_tokens, else the window (prepare cuts it to the room left)."""
        if self.max_completion_tokens is not None:
            return self.max_completion_tokens
        return self.max_tokens if self.max_tokens is not None else window


# -- one answering path, two shapes -----------------------------------------------------------------------


def _usage(prompt_tokens: int, completion_tokens: int) -> dict[str, int]:
    return {
        "prompt_tokens": prompt_tokens,
        "completion_tokens": completion_tokens,
        "total_tokens": prompt_tokens + completion_tokens,
    }


def _finish(reason: str | None) -> str | None:
    return OPENAI_FINISH[reason] if reason else None


@dataclass(frozen=True)
class Shape:
    """How one endpoint writes its answer: the objects' names, the whole answer's choice, and the choices
    each streamed token event becomes (`opening`: the choices sent before the first token). `logprobs`, in
    both, is what the request's LogprobWriter has for them (None where it asked for none)."""

    id_prefix: str
    whole: str
    chunk: str
    chat: bool
    # (text, OpenAI finish reason, logprobs) -> the whole answer's choice
    choice: Callable[[str, str, dict[str, Any] | None], dict[str, Any]]
    chunk_choices: Callable[[TokenEvent, LogprobWriter | None], list[dict[str, Any]]]
    opening: tuple[dict[str, Any], ...] = ()


def _take(writer: LogprobWriter | None, event: TokenEvent | None = None) -> dict[str, Any] | None:
    if writer is None:
        return None
    if event is not None:
        writer.add(event)
    return writer.take()


def _completion_chunk(event: TokenEvent, writer: LogprobWriter | None) -> list[dict[str, Any]]:
    """One chunk per token event, its finish reason on the last (as before the chat endpoint existed)."""
    logprobs = _take(writer, event)
    return [
        {"index": 0, "text": event.text, "logprobs": logprobs, "finish_reason": _finish(event.finish_reason)}
    ]


def _chat_chunks(event: TokenEvent, writer: LogprobWriter | None) -> list[dict[str, Any]]:
    """A content delta when the token completes text; the finish reason in a last chunk of its own with
    an empty delta, as OpenAI sends it. A token's logprobs go with the first chunk sent after it."""
    if writer is not None:
        writer.add(event)
    chunks = []
    if event.text:
        chunks.append(
            {"index": 0, "delta": {"content": event.text}, "logprobs": _take(writer), "finish_reason": None}
        )
    if event.finish_reason is not None:
        chunks.append(
            {
                "index": 0,
                "delta": {},
                "logprobs": _take(writer),
                "finish_reason": _finish(event.finish_reason),
            }
        )
    return chunks


COMPLETION = Shape(
    "cmpl",
    "text_completion",
    "text_completion",
    False,
    lambda text, finish, logprobs: {"index": 0, "text": text, "logprobs": logprobs, "finish_reason": finish},
    _completion_chunk,
)
CHAT = Shape(
    "chatcmpl",
    "chat.completion",
    "chat.completion.chunk",
    True,
    lambda text, finish, logprobs: {
        "index": 0,
        "message": {"role": "assistant", "content": text},
        "logprobs": logprobs,
        "finish_reason": finish,
    },
    _chat_chunks,
    opening=(
        {"index": 0, "delta": {"role": "assistant", "content": ""}, "logprobs": None, "finish_reason": None},
    ),
)


@dataclass
class Choice:
    """One prompt's part of an answer: its engine request, its place, its log-probabilities' writer where
    the request asked for them, and its echoed prompt's text (completions' `echo`) until sent."""

    prepared: Prepared
    index: int = 0
    logprobs: LogprobWriter | None = None
    echo: str | None = None
    counts_prompt: bool = True  # usage counts a prompt once, however many answers it gets


class Answer:
    """One request's answer: its shape and envelope (id, created, model) around its choices, one per prompt
    (chat: one), decoded together by the engine (continuous batching) and streamed as their tokens come."""

    def __init__(self, shape: Shape, model: str, choices: list[Choice]) -> None:
        self.shape = shape
        self.model = model
        self.choices = choices
        self.id = f"{shape.id_prefix}-{uuid.uuid4().hex}"
        self.created = int(time.time())

    def envelope(self, kind: str, choices: list[dict[str, Any]]) -> dict[str, Any]:
        return {
            "id": self.id,
            "object": kind,
            "created": self.created,
            "model": self.model,
            "choices": choices,
        }

    async def respond(self, stream: bool, include_usage: bool, x: Exchange) -> Any:
        """The whole answer, or its events once the engine has every choice's first tokens (so a refusal,
        429 or 503, is still a status code before any byte is sent)."""
        if stream:
            opened = await _open_all([c.prepared for c in self.choices])
            return EventStream(self._events(opened, include_usage, x))
        results: list[Completion] = await all_or_none(
            complete(c.prepared, c.logprobs.add if c.logprobs is not None else None) for c in self.choices
        )
        choices = [
            self.shape.choice(
                (c.echo or "") + r["generated_text"], OPENAI_FINISH[r["finish_reason"]], _take(c.logprobs)
            )
            | {"index": c.index}
            for c, r in zip(self.choices, results, strict=True)
        ]
        prompt_tokens = sum(
            r["prompt_tokens"] for c, r in zip(self.choices, results, strict=True) if c.counts_prompt
        )
        usage = _usage(prompt_tokens, sum(r["tokens"] for r in results))
        return self.envelope(self.shape.whole, choices) | {"usage": usage}

    async def _events(
        self,
        opened: list[tuple[Sequence, AsyncIterator[list[TokenEvent]]]],
        include_usage: bool,
        x: Exchange,
    ) -> AsyncIterator[bytes]:
        kind = self.shape.chunk
        streams = [groups for _, groups in opened]
        try:
            opening = b"".join(
                sse(self.envelope(kind, [choice | {"index": c.index}]))
                for c in self.choices
                for choice in self.shape.opening
            )
            async for i, group in _merged(streams):
                choice = self.choices[i]
                chunks = [
                    sse(self.envelope(kind, [c])) for e in group for c in self._chunk_choices(choice, e)
                ]
                if chunks or opening:  # a chat token that ends mid-character has no chunk yet
                    yield opening + b"".join(chunks)
                    opening = b""
            if include_usage:
                prompt_tokens = sum(
                    len(seq.prompt)
                    for c, (seq, _) in zip(self.choices, opened, strict=True)
                    if c.counts_prompt
                )
                usage = _usage(prompt_tokens, sum(seq.streamed for seq, _ in opened))
                yield sse(self.envelope(kind, []) | {"usage": usage})
        except Exception as e:  # the stream has started: the error travels as an event (issue 26, point 4)
            stream_failed(x, e)
            yield sse({"error": {"message": str(e), "type": "server_error"}})
        yield sse("[DONE]")

    def _chunk_choices(self, choice: Choice, event: TokenEvent) -> list[dict[str, Any]]:
        """The event's chunk choices at the choice's place; the echoed prompt (completions only) opens its
        first one's text."""
        chunks = [c | {"index": choice.index} for c in self.shape.chunk_choices(event, choice.logprobs)]
        if choice.echo is not None and chunks:
            chunks[0] = chunks[0] | {"text": choice.echo + chunks[0]["text"]}
            choice.echo = None
        return chunks


async def _open_all(prepared: list[Prepared]) -> list[tuple[Sequence, AsyncIterator[list[TokenEvent]]]]:
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


async def _merged(
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


# -- the handlers -----------------------------------------------------------------------------------------


async def handle_completions(body: CompletionRequest, x: Exchange, c: Collaborators) -> Any:
    model = c.resolve(NAME, body.model, None, x)
    params = body.sampling(body.max_tokens, body.logprobs)
    if body.echo:
        params = dataclasses.replace(params, prompt_logprobs=body.logprobs)
    choices = []
    for i, text in enumerate(body.texts):
        prepared = prepare(model, text, params, body.truncate_prompt, c.metrics, x)
        echo = model.encoder.decode(prepared.prompt) if body.echo else None
        for j, sample in enumerate(body.samples(prepared.params)):
            writer = None
            if body.logprobs is not None:
                writer = LogprobWriter(
                    model.encoder, chat=False, prompt=prepared.prompt if body.echo else None
                )
            one = dataclasses.replace(prepared, params=sample)
            choices.append(Choice(one, i * body.n + j, writer, echo, counts_prompt=j == 0))
    return await Answer(COMPLETION, model.name, choices).respond(body.stream, body.include_usage, x)


async def handle_chat_completions(body: ChatCompletionRequest, x: Exchange, c: Collaborators) -> Any:
    model = c.resolve(NAME, body.model, None, x)
    if model.chat is None:
        raise InvalidInputError(
            f"model {model.name!r} cannot chat: {model.no_chat_reason}; use /v1/completions with a prompt",
            param="model",
        )
    try:
        prompt = model.chat.render([m.model_dump(exclude_none=True) for m in body.messages])
    except ChatTemplateError as e:
        raise InvalidInputError(
            f"the model's chat template refused the messages: {e}", param="messages"
        ) from None
    params = body.sampling(body.token_limit(model.manifest.max_sequence_length), body.alternatives)
    prepared = prepare(model, prompt, params, body.truncate_prompt, c.metrics, x, rendered=True)
    choices = [
        Choice(
            dataclasses.replace(prepared, params=sample),
            j,
            LogprobWriter(model.encoder, chat=True) if params.logprobs is not None else None,
            counts_prompt=j == 0,
        )
        for j, sample in enumerate(body.samples(prepared.params))
    ]
    return await Answer(CHAT, model.name, choices).respond(body.stream, body.include_usage, x)
