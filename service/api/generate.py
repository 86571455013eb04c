"""`POST /v1/generate` (whole or streamed as Server-Sent Events) and OpenAI's `POST /v1/completions`."""

from __future__ import annotations

import json
import logging
import time
import uuid
from collections.abc import AsyncIterator, Callable
from typing import Any

from fastapi import APIRouter, Depends, Request
from fastapi.responses import StreamingResponse

from service.api.deps import Collaborators, json_collaborators, label_request
from service.api.schemas import (
    ERRORS,
    OPENAI_ERRORS,
    CompletionRequest,
    GenerateRequest,
    GenerateResponse,
    SamplingFields,
)
from service.api.task_route import TaskRoute
from service.generation.sampling import SamplingParams
from service.generation.sequence import Sequence, TokenEvent
from service.processors.generation import complete, open_stream, prepare

log = logging.getLogger(__name__)
router = APIRouter(tags=["generation"], route_class=TaskRoute)
OPENAI_FINISH = {"eos": "stop", "stop": "stop", "length": "length"}


def sampling(fields: SamplingFields, max_new_tokens: int) -> SamplingParams:
    return SamplingParams(
        max_new_tokens=max_new_tokens,
        temperature=fields.temperature,
        top_k=fields.top_k,
        top_p=fields.top_p,
        repetition_penalty=fields.repetition_penalty,
        seed=fields.seed,
        stop=fields.stop,
        ignore_eos=fields.ignore_eos,
    )


def sse(payload: dict[str, Any] | str) -> bytes:
    data = payload if isinstance(payload, str) else json.dumps(payload, separators=(",", ":"))
    return f"data: {data}\n\n".encode()


def event_stream(body: AsyncIterator[bytes]) -> StreamingResponse:
    headers = {"Cache-Control": "no-cache", "X-Accel-Buffering": "no"}
    return StreamingResponse(body, media_type="text/event-stream", headers=headers)


@router.post(
    "/v1/generate",
    response_model=GenerateResponse,
    responses=ERRORS,
    summary="Continue a prompt; with stream=true, one SSE event per token and a final event.",
)
async def generate(
    body: GenerateRequest, request: Request, c: Collaborators = Depends(json_collaborators)
) -> Any:
    model = c.registry.resolve("text-generation", body.model, body.version)
    label_request(request, model)
    prepared = prepare(
        model, body.prompt, sampling(body, body.max_new_tokens), body.truncate_prompt, c.metrics
    )
    if not body.stream:
        result = await complete(prepared)
        return GenerateResponse(
            generated_text=result["generated_text"],
            tokens=result["tokens"],
            finish_reason=result["finish_reason"],
        )
    events = _generate_events(*await open_stream(prepared), failed=failure_recorder(request))
    return event_stream(events)  # opened first: a 429 is still a 429


def failure_recorder(request: Request) -> Callable[[Exception], None]:
    """How a stream that fails after its first event says so: the 200 is sent, so the request metrics
    count it as a 500 and its access line carries the error (service.api.middleware, service.api.access)."""

    def failed(error: Exception) -> None:
        request.state.stream_error = str(error) or type(error).__name__
        log.error("a stream failed after it started: %s", error)

    return failed


async def _generate_events(
    seq: Sequence, groups: AsyncIterator[list[TokenEvent]], failed: Callable[[Exception], None]
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
        failed(e)
        yield sse({"error": str(e), "error_type": "backend"})


@router.post("/v1/completions", responses=OPENAI_ERRORS, summary="OpenAI-compatible text completions.")
async def completions(
    body: CompletionRequest, request: Request, c: Collaborators = Depends(json_collaborators)
) -> Any:
    model = c.registry.resolve("text-generation", body.model, None)
    label_request(request, model)
    prepared = prepare(model, body.text, sampling(body, body.max_tokens), body.truncate_prompt, c.metrics)
    completion_id = f"cmpl-{uuid.uuid4().hex}"
    created = int(time.time())
    if body.stream:
        usage = bool((body.stream_options or {}).get("include_usage"))
        seq, groups = await open_stream(prepared)  # a 429 is still a 429
        failed = failure_recorder(request)
        return event_stream(
            _completion_chunks(seq, groups, completion_id, created, model.name, usage, failed)
        )
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
    failed: Callable[[Exception], None],
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
        failed(e)
        yield sse({"error": {"message": str(e), "type": "server_error"}})
    yield sse("[DONE]")
