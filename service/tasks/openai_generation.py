"""OpenAI's generation endpoints: `POST /v1/completions` and `POST /v1/chat/completions`.

Both are one path: a prompt (given, or rendered from chat messages with the model's chat template,
service.tasks.chat_template) goes through the generation endpoints' shared preparation and engine calls
(service.tasks.generation_base); only the answer's shape differs (`text_completion` with `text`,
`chat.completion` with `message`, and their stream chunks). Errors are in OpenAI's shape (the route's
`errors="openai"`), so the official client's `completions.create` and `chat.completions.create` work, whole
and streamed, `usage` and `logprobs` included (service.tasks.openai_logprobs). The requests' schemas are
service.tasks.openai_requests; a completions request may carry several prompts and `n` answers each, one
choice apiece, decoded together.
"""

from __future__ import annotations

import dataclasses
import time
import uuid
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from typing import Any

from service.batching import all_or_none
from service.exchange import Exchange
from service.generation.sequence import FinishReason, Sequence, TokenEvent
from service.tasks.call_stream import CallStream
from service.tasks.chat_template import ChatTemplateError
from service.tasks.contract import Collaborators, EventStream, InvalidInputError
from service.tasks.generation_base import (
    NAME,
    Completion,
    Prepared,
    complete,
    merged_streams,
    open_streams,
    prepare,
    sse,
    stream_failed,
)
from service.tasks.generation_shadow import shadow_hook
from service.tasks.openai_logprobs import LogprobWriter
from service.tasks.openai_requests import ChatCompletionRequest, CompletionRequest
from service.tasks.openai_tools import (
    NO_PARSER,
    ToolCalling,
    call_id,
    conversation,
    openai_calls,
    tool_format,
)

OPENAI_FINISH = {"eos": "stop", "stop": "stop", "length": "length"}


# -- one answering path, two shapes -----------------------------------------------------------------------


def _usage(prompt_tokens: int, completion_tokens: int, cached_tokens: int) -> dict[str, Any]:
    """OpenAI's usage; `prompt_tokens_details.cached_tokens`: the prompt tokens the prefix cache had."""
    return {
        "prompt_tokens": prompt_tokens,
        "completion_tokens": completion_tokens,
        "total_tokens": prompt_tokens + completion_tokens,
        "prompt_tokens_details": {"cached_tokens": cached_tokens},
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
    calling: ToolCalling | None = None  # chat answers that are tool calls (service.tasks.openai_tools)


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


def tool_shape(calling: ToolCalling) -> Shape:
    """Chat, the answer read as `message.tool_calls` and the text around them (all text where it holds
    no whole calls, or was cut at the token limit)."""

    def choice(text: str, finish: str, logprobs: dict[str, Any] | None) -> dict[str, Any]:
        parsed = calling.read(text) if finish != "length" or calling.grammar is not None else None
        if parsed is None or not parsed.calls:
            return CHAT.choice(text, finish, logprobs)
        message = {"role": "assistant", "content": parsed.content, "tool_calls": openai_calls(parsed.calls)}
        reason = finish if finish == "length" else calling.finish
        return {"index": 0, "message": message, "logprobs": logprobs, "finish_reason": reason}

    return dataclasses.replace(CHAT, choice=choice, calling=calling)


def _grammar_chunks(calling: ToolCalling, choice: Choice, event: TokenEvent) -> list[dict[str, Any]]:
    """Calls written under a grammar, OpenAI's way: each call's id and name with its first fragment, then
    fragments of its arguments as the model writes them (service.tasks.call_stream); the finish reason
    last, after the answer as text where it held no call."""
    logprobs = _take(choice.logprobs, event)
    if choice.calls is None:
        choice.calls = CallStream(calling.named)
    chunks = []
    for piece in choice.calls.feed(event.text):
        call: dict[str, Any] = {"index": piece.call, "function": {"arguments": piece.arguments}}
        if piece.name is not None:
            call |= {"id": call_id(), "type": "function", "function": {"name": piece.name} | call["function"]}
        chunks.append(
            {"index": 0, "delta": {"tool_calls": [call]}, "logprobs": logprobs, "finish_reason": None}
        )
        logprobs = None
    if event.finish_reason is None:
        return chunks
    whole = tool_shape(calling).choice(choice.calls.text, _finish(event.finish_reason) or "stop", None)
    message = whole["message"]
    if not choice.calls.calls and (message["content"] or message.get("tool_calls")):  # read whole, at the end
        delta = (
            {"content": message["content"]}
            if message["content"]
            else {"tool_calls": [c | {"index": i} for i, c in enumerate(message["tool_calls"])]}
        )
        chunks.append({"index": 0, "delta": delta, "logprobs": logprobs, "finish_reason": None})
        logprobs = None
    return [*chunks, {"index": 0, "delta": {}, "logprobs": logprobs, "finish_reason": whole["finish_reason"]}]


def _tool_chunks(calling: ToolCalling, choice: Choice, event: TokenEvent) -> list[dict[str, Any]]:
    """Under "auto", text as it comes but for what may begin a call; once the answer is complete, the text
    still held and the calls, in one delta each, and the finish reason. Calls under a grammar stream as
    they are written (`_grammar_chunks`)."""
    if calling.grammar is not None:
        return _grammar_chunks(calling, choice, event)
    if choice.logprobs is not None:
        choice.logprobs.add(event)
    choice.text += event.text
    chunks: list[dict[str, Any]] = []
    if event.finish_reason is None:
        ready = calling.held(choice.text)
        if ready > choice.sent:
            delta = {"content": choice.text[choice.sent : ready]}
            chunks.append(
                {"index": 0, "delta": delta, "logprobs": _take(choice.logprobs), "finish_reason": None}
            )
            choice.sent = ready
        return chunks
    whole = tool_shape(calling).choice(choice.text, _finish(event.finish_reason) or "stop", None)
    message, logprobs = whole["message"], _take(choice.logprobs)
    rest = (message["content"] or "")[choice.sent :]
    if rest:
        chunks.append({"index": 0, "delta": {"content": rest}, "logprobs": logprobs, "finish_reason": None})
        logprobs = None
    if message.get("tool_calls"):
        calls = [c | {"index": i} for i, c in enumerate(message["tool_calls"])]
        chunks.append(
            {"index": 0, "delta": {"tool_calls": calls}, "logprobs": logprobs, "finish_reason": None}
        )
        logprobs = None
    finish = {"index": 0, "delta": {}, "logprobs": logprobs, "finish_reason": whole["finish_reason"]}
    return [*chunks, finish]


@dataclass
class Choice:
    """One prompt's part of an answer: its engine request, its place, its log-probabilities' writer where
    the request asked for them, and its echoed prompt's text (completions' `echo`) until sent."""

    prepared: Prepared
    index: int = 0
    logprobs: LogprobWriter | None = None
    echo: str | None = None
    counts_prompt: bool = True  # usage counts a prompt once, however many answers it gets
    # `max_tokens: 0` with `echo`: the prompt scored, nothing generated. The engine's prefill still chooses a
    # token (it is one engine call either way); the answer leaves it out.
    scores_only: bool = False
    text: str = ""  # a streamed "auto" answer's text so far (service.tasks.openai_tools)
    sent: int = 0  # how much of it went out as content
    calls: CallStream | None = None  # a streamed grammar's calls, as read so far

    def seen(self, event: TokenEvent) -> TokenEvent:
        """The event as this choice's client sees it (a scores-only choice's token is none of its)."""
        if not self.scores_only:
            return event
        finish: FinishReason | None = "length" if event.finish_reason is not None else None
        return dataclasses.replace(event, token_id=None, text="", logprob=None, finish_reason=finish)

    def on_event(self, event: TokenEvent) -> None:
        if self.logprobs is not None:
            self.logprobs.add(self.seen(event))


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
            opened = await open_streams([c.prepared for c in self.choices])
            return EventStream(self._events(opened, include_usage, x))
        results: list[Completion] = await all_or_none(complete(c.prepared, c.on_event) for c in self.choices)
        for c, r in zip(self.choices, results, strict=True):
            if c.scores_only:
                r["generated_text"], r["tokens"], r["finish_reason"] = "", 0, "length"
        choices = [
            self.shape.choice(
                (c.echo or "") + r["generated_text"], OPENAI_FINISH[r["finish_reason"]], _take(c.logprobs)
            )
            | {"index": c.index}
            for c, r in zip(self.choices, results, strict=True)
        ]
        counted = [r for c, r in zip(self.choices, results, strict=True) if c.counts_prompt]
        prompt_tokens, cached = (sum(r[key] for r in counted) for key in ("prompt_tokens", "cached_tokens"))
        usage = _usage(prompt_tokens, sum(r["tokens"] for r in results), cached)
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
            async for i, group in merged_streams(streams):
                choice = self.choices[i]
                chunks = [
                    sse(self.envelope(kind, [c])) for e in group for c in self._chunk_choices(choice, e)
                ]
                if chunks or opening:  # a chat token that ends mid-character has no chunk yet
                    yield opening + b"".join(chunks)
                    opening = b""
            if include_usage:
                counted = [seq for c, (seq, _) in zip(self.choices, opened, strict=True) if c.counts_prompt]
                prompt_tokens = sum(len(seq.prompt) for seq in counted)
                cached = sum(seq.cached_tokens for seq in counted)
                made = sum(
                    seq.streamed
                    for c, (seq, _) in zip(self.choices, opened, strict=True)
                    if not c.scores_only
                )
                usage = _usage(prompt_tokens, made, cached)
                yield sse(self.envelope(kind, []) | {"usage": usage})
        except Exception as e:  # the stream has started: the error travels as an event (issue 26, point 4)
            stream_failed(x, e)
            yield sse({"error": {"message": str(e), "type": "server_error"}})
        yield sse("[DONE]")

    def _chunk_choices(self, choice: Choice, event: TokenEvent) -> list[dict[str, Any]]:
        """The event's chunk choices at the choice's place; the echoed prompt (completions only) opens its
        first one's text."""
        event = choice.seen(event)
        if self.shape.calling is not None:
            return [c | {"index": choice.index} for c in _tool_chunks(self.shape.calling, choice, event)]
        chunks = [c | {"index": choice.index} for c in self.shape.chunk_choices(event, choice.logprobs)]
        if choice.echo is not None and chunks:
            chunks[0] = chunks[0] | {"text": choice.echo + chunks[0]["text"]}
            choice.echo = None
        return chunks


# -- the handlers -----------------------------------------------------------------------------------------


async def handle_completions(body: CompletionRequest, x: Exchange, c: Collaborators) -> Any:
    model = c.resolve(NAME, body.model, None, x)
    params = body.sampling(max(body.max_tokens, 1), body.logprobs)
    if body.echo:
        params = dataclasses.replace(params, prompt_logprobs=body.logprobs)
    choices = []
    for i, prompt in enumerate(body.prompts):
        prepared = prepare(model, prompt, params, body.truncate_prompt, c.metrics, x)
        prepared = dataclasses.replace(prepared, on_done=shadow_hook(c, model, x))
        echo = model.encoder.decode(prepared.prompt) if body.echo else None
        for j, sample in enumerate(body.samples(prepared.params)):
            writer = None
            if body.logprobs is not None:
                writer = LogprobWriter(
                    model.encoder, chat=False, prompt=prepared.prompt if body.echo else None
                )
            one = dataclasses.replace(prepared, params=sample)
            choices.append(
                Choice(one, i * body.n + j, writer, echo, j == 0, scores_only=body.max_tokens == 0)
            )
    return await Answer(COMPLETION, model.name, choices).respond(body.stream, body.include_usage, x)


async def handle_chat_completions(body: ChatCompletionRequest, x: Exchange, c: Collaborators) -> Any:
    model = c.resolve(NAME, body.model, None, x)
    if model.chat is None:
        raise InvalidInputError(
            f"model {model.name!r} cannot chat: {model.no_chat_reason}; use /v1/completions with a prompt",
            param="model",
        )
    calling = body.calling
    template = model.manifest.chat.template if model.manifest.chat else None
    written = tool_format(c.settings.tool_call_parser, template)
    if calling is not None and calling.grammar is None:
        if written is None:
            raise InvalidInputError(NO_PARSER, param="tool_choice")
        calling = dataclasses.replace(calling, format=written)
    tools = [t.model_dump(exclude_none=True) for t in body.tools] if body.tools and calling else None
    try:
        # an assistant's tool calls without text: "" for templates that read every message's content
        messages = [{"content": "", **m.model_dump(exclude_none=True)} for m in body.messages]
        prompt = model.chat.render(conversation(messages, tools, calling, model.chat, written), tools)
    except ChatTemplateError as e:
        raise InvalidInputError(
            f"the model's chat template refused the messages: {e}", param="messages"
        ) from None
    params = body.sampling(body.token_limit(model.manifest.max_sequence_length), body.alternatives)
    prepared = prepare(model, prompt, params, body.truncate_prompt, c.metrics, x, rendered=True)
    prepared = dataclasses.replace(prepared, on_done=shadow_hook(c, model, x))
    choices = [
        Choice(
            dataclasses.replace(prepared, params=sample),
            j,
            LogprobWriter(model.encoder, chat=True) if params.logprobs is not None else None,
            counts_prompt=j == 0,
        )
        for j, sample in enumerate(body.samples(prepared.params))
    ]
    shape = CHAT if calling is None else tool_shape(calling)
    return await Answer(shape, model.name, choices).respond(body.stream, body.include_usage, x)
