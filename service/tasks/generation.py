"""Text generation: a prompt -> tokens from the generation engine, whole or streamed as Server-Sent Events.

The task's endpoints: `POST /v1/generate` (here), OpenAI's `POST /v1/completions` and
`POST /v1/chat/completions` (service.tasks.openai_generation, chat prompts rendered by
service.tasks.chat_template); v2: PROMPT BYTES [b] -> TEXT BYTES [b], TOKENS INT64 [b], FINISH_REASON BYTES
[b], parameters max_new_tokens (default 32) and the sampling fields of /v1/generate. What they share
(sampling fields, fitting the prompt to the window and the cache budget, the engine calls, SSE) is in
service.tasks.generation_base.
"""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import AsyncIterator
from typing import Annotated, Any

import numpy as np
from pydantic import BeforeValidator, Field
from typing_extensions import TypedDict  # pydantic reads only this one's fields on Python 3.11

from service.batch_policy import DeadlineExceededError
from service.batching import all_or_none
from service.exchange import Exchange
from service.generation.grammar import constraint_grammar
from service.generation.sampling import SamplingParams
from service.generation.sequence import Sequence, TokenEvent
from service.tasks.common import passed, strings, validated
from service.tasks.contract import (
    Collaborators,
    Endpoint,
    EventStream,
    ModelRequest,
    ServedTask,
    V2Interface,
    V2Job,
    tensor,
)
from service.tasks.generation_base import (
    NAME,
    SamplingFields,
    complete,
    open_stream,
    prepare,
    sse,
    stream_failed,
    text_pieces,
)
from service.tasks.generation_shadow import shadow_hook
from service.tasks.openai_generation import handle_chat_completions, handle_completions
from service.tasks.openai_requests import ChatCompletionRequest, CompletionRequest

# -- /v1/generate -----------------------------------------------------------------------------------------


def _tgi_grammar(value: Any) -> str | None:
    """text-generation-inference's `grammar`: {"type": "json", "value": a schema} or {"type": "regex",
    "value": "..."}, as llguidance's grammar text."""
    if value is None:
        return None
    if not isinstance(value, dict) or value.get("type") not in ("json", "regex") or "value" not in value:
        raise ValueError('expected {"type": "json", "value": {...}} or {"type": "regex", "value": "..."}')
    return constraint_grammar(value["type"], value["value"])


def _checked_grammar(value: Any) -> Any:
    _tgi_grammar(value)
    return value


class GenerateRequest(ModelRequest, SamplingFields):
    prompt: str = Field(..., min_length=1, examples=["The film was"])
    max_new_tokens: int = Field(32, ge=1, le=4096, description="Most tokens to generate.")
    stream: bool = Field(False, description="Server-Sent Events: one event per token, then a final one.")
    grammar: Annotated[dict[str, Any] | None, BeforeValidator(_checked_grammar)] = Field(
        None,
        description='text-generation-inference\'s: {"type": "json", "value": a JSON schema} or {"type": '
        '"regex", "value": "..."}: every token keeps the text inside it.',
    )

    def sampling(self, max_new_tokens: int, logprobs: int | None = None) -> SamplingParams:
        params = super().sampling(max_new_tokens, logprobs)
        return dataclasses.replace(params, grammar=_tgi_grammar(self.grammar))


class GenerateResponse(TypedDict):
    generated_text: str
    tokens: Annotated[
        int, Field(description="Tokens generated (the eos token included when it ended the text).")
    ]
    finish_reason: Annotated[str, Field(description="length | eos | stop")]


async def handle_generate(
    body: GenerateRequest, x: Exchange, c: Collaborators
) -> GenerateResponse | EventStream:
    model = c.resolve(NAME, body.model, body.version, x)
    params = body.sampling(body.max_new_tokens)
    prepared = prepare(model, body.prompt, params, body.truncate_prompt, c.metrics, x)
    prepared = dataclasses.replace(prepared, on_done=shadow_hook(c, model, x))
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


async def infer_stream(job: V2Job) -> AsyncIterator[dict[str, np.ndarray]]:
    """One prompt's text in the pieces the engine hands out: TEXT a piece, TOKENS so far, FINISH_REASON ""
    until the last. Several prompts in one request: one answer, `infer`'s (a piece of which prompt?)."""
    if len(job.texts["PROMPT"]) != 1:
        yield await infer(job)
        return
    body = validated(
        GenerateRequest,
        {"prompt": job.texts["PROMPT"][0], **passed(job, TASK.v2.parameters)},
        {"prompt": "PROMPT"},
    )
    prepared = prepare(
        job.model, body.prompt, body.sampling(body.max_new_tokens), body.truncate_prompt, job.c.metrics, job.x
    )
    _, groups = await open_stream(prepared)  # a refusal before the first token is still the request's error
    async for text, tokens, finish in text_pieces(groups):
        yield {
            "TEXT": strings([text]),
            "TOKENS": np.array([tokens], dtype=np.int64),
            "FINISH_REASON": strings([finish or ""]),
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
            streams=True,
        ),
        Endpoint(
            "/v1/completions",
            CompletionRequest,
            None,  # OpenAI's completion object, built as a dict
            "OpenAI-compatible text completions.",
            handle_completions,
            errors="openai",
            tags=("generation",),
            streams=True,
        ),
        Endpoint(
            "/v1/chat/completions",
            ChatCompletionRequest,
            None,  # OpenAI's chat completion object, built as a dict
            "OpenAI-compatible chat completions, for models exported with a chat template.",
            handle_chat_completions,
            errors="openai",
            tags=("generation",),
            streams=True,
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
        stream=infer_stream,
    ),
)
