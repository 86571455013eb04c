"""Triton's generate extension: text in, text out, for generation models, as Triton's LLM backends (vLLM,
TensorRT-LLM) serve it and their tools (genai-perf, LangChain's Triton client) call it.

    POST /v2/models/{name}[/versions/{version}]/generate           one JSON answer
    POST /v2/models/{name}[/versions/{version}]/generate_stream    Server-Sent Events

Request: `{"text_input": str, "parameters": {...}, "id": str}` (`parameters` and `id` optional). As Triton
passes a request's other properties on as parameters, a parameter may also stand at the top level.
Parameters: `max_tokens` (or `max_new_tokens`; default 32), `temperature`, `top_p`, `top_k`,
`repetition_penalty`, `presence_penalty`, `frequency_penalty`, `seed`, `stop`, `stop_token_ids`,
`min_tokens`, `ignore_eos`, `truncate_prompt`, with /v1/generate's limits;
`exclude_input_in_output` (default true: the continuation alone; false: the prompt, then the
continuation, as vLLM's backend returns by default); `stream` is accepted and left to the URL. Any other is
a 400 naming it: a parameter this server would silently ignore is a wrong answer waiting to happen.

Answer: `{"model_name", "model_version", "text_output", "finish_reason", "tokens"}` (and `id` when the
request had one). generate_stream sends the same shape per group of tokens the engine hands out, each
`text_output` a piece of the text; the last event has the `finish_reason`. A failure before the first
event is a v2 error (`{"error": message}` and its status: 400, 404, 429, 503); after it, an event
`{"error": message}` (the status line is sent by then, as Triton does).
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

from fastapi import Depends, Request, Response
from fastapi.responses import JSONResponse, StreamingResponse
from pydantic import BaseModel, ConfigDict, Field

from service.api.disconnect import until_disconnect
from service.api.task_route import SSE_HEADERS
from service.api.v2 import find_model, served, v2_router
from service.api.v2_schemas import TensorError
from service.exchange import Exchange, exchange_of
from service.generation.sequence import TokenEvent
from service.tasks.common import validated
from service.tasks.contract import Collaborators
from service.tasks.generation import GenerateRequest
from service.tasks.generation_base import complete, open_stream, prepare, sse, stream_failed, text_pieces

router = v2_router()

SAMPLING = (
    "temperature",
    "top_p",
    "top_k",
    "repetition_penalty",
    "presence_penalty",
    "frequency_penalty",
    "seed",
    "stop",
    "stop_token_ids",
    "min_tokens",
    "ignore_eos",
    "truncate_prompt",
)
LENGTH = ("max_tokens", "max_new_tokens")  # vLLM's and TensorRT-LLM's name, and ours
OWN = ("exclude_input_in_output", "stream")
KNOWN = frozenset((*SAMPLING, *LENGTH, *OWN))


class GenerateExtensionRequest(BaseModel):
    """What the OpenAPI page shows; the handler reads the body itself (extra properties are parameters)."""

    model_config = ConfigDict(extra="allow")

    text_input: str = Field(..., min_length=1, examples=["The capital of France is"])
    parameters: dict[str, Any] = Field(
        default_factory=dict,
        examples=[{"max_tokens": 16, "temperature": 0}],
        description="max_tokens, temperature, top_p, top_k, repetition_penalty, presence_penalty, "
        "frequency_penalty, seed, stop, stop_token_ids, min_tokens, ignore_eos, "
        "truncate_prompt, exclude_input_in_output, stream; also accepted at the top level.",
    )
    id: str | None = None


class GenerateExtensionResponse(BaseModel):
    model_name: str
    model_version: str
    text_output: str
    finish_reason: str | None = Field(None, description="length | eos | stop (a stream's last event)")
    tokens: int | None = Field(None, description="Tokens generated so far.")
    id: str | None = None


STREAMED: dict[int | str, dict[str, Any]] = {
    200: {
        "description": "generate_stream: one `data: {...}` event per group of tokens, in this shape.",
        "content": {"text/event-stream": {"schema": {}}},
    }
}


def read_request(raw: bytes) -> tuple[str, dict[str, Any], str | None]:
    """The body as (its text_input, its parameters, its id), or a 400 saying why."""
    try:
        body = json.loads(raw) if raw else None
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise TensorError(f"the body is not JSON: {e}") from None
    if not isinstance(body, dict):
        raise TensorError('expected a JSON object: {"text_input": "...", "parameters": {...}}')
    text = body.get("text_input")
    if not isinstance(text, str) or not text:
        raise TensorError("text_input: expected a non-empty string (the prompt)")
    parameters = body.get("parameters", {})
    if not isinstance(parameters, dict):
        raise TensorError("parameters: expected an object of name: value")
    request_id = body.get("id")
    if request_id is not None and not isinstance(request_id, str):
        raise TensorError("id: expected a string")
    extra = {k: v for k, v in body.items() if k not in ("text_input", "parameters", "id")}
    both = sorted(set(extra) & set(parameters))
    if both:
        raise TensorError(f"given both at the top level and in parameters: {', '.join(both)}")
    return text, {**extra, **parameters}, request_id


def generate_request(text: str, parameters: dict[str, Any]) -> tuple[GenerateRequest, bool]:
    """The /v1/generate request these parameters ask for, and whether the prompt leads the output."""
    unknown = sorted(set(parameters) - KNOWN)
    if unknown:
        raise TensorError(
            f"parameters.{unknown[0]}: not a parameter of this server's generate extension "
            f"(it takes {', '.join(sorted(KNOWN))})"
        )
    lengths = [k for k in LENGTH if k in parameters]
    if len(lengths) > 1:
        raise TensorError("parameters: max_tokens and max_new_tokens are the same limit; give one")
    values: dict[str, Any] = {"prompt": text, **{k: parameters[k] for k in SAMPLING if k in parameters}}
    names = {"prompt": "text_input"}
    if lengths:
        values["max_new_tokens"] = parameters[lengths[0]]
        names["max_new_tokens"] = f"parameters.{lengths[0]}"
    exclude = parameters.get("exclude_input_in_output", True)
    if not isinstance(exclude, bool):
        raise TensorError("parameters.exclude_input_in_output: expected true or false")
    if not isinstance(parameters.get("stream", False), bool):
        raise TensorError("parameters.stream: expected true or false")
    return validated(GenerateRequest, values, names), not exclude


async def generate(
    request: Request, c: Collaborators, name: str, version: str | None, stream: bool
) -> Response:
    model = find_model(c.registry, name, version)
    x = exchange_of(request.scope)
    x.serve(model.name, model.manifest.task, model.stats)
    text, parameters, request_id = read_request(await request.body())
    body, echo = generate_request(text, parameters)
    prepared = prepare(
        model, body.prompt, body.sampling(body.max_new_tokens), body.truncate_prompt, c.metrics, x
    )
    head: dict[str, Any] = {"model_name": model.name, "model_version": str(model.manifest.version)}
    if request_id is not None:
        head["id"] = request_id
    prefix = text if echo else ""
    if not stream:
        result = await until_disconnect(request.scope, request.receive, complete(prepared))
        return JSONResponse(
            head
            | {
                "text_output": prefix + result["generated_text"],
                "finish_reason": result["finish_reason"],
                "tokens": result["tokens"],
            }
        )
    _, groups = await open_stream(prepared)  # a refusal before the first token is still a status code
    return StreamingResponse(
        _events(head, prefix, groups, x), media_type="text/event-stream", headers=SSE_HEADERS
    )


async def _events(
    head: dict[str, Any], prefix: str, groups: AsyncIterator[list[TokenEvent]], x: Exchange
) -> AsyncIterator[bytes]:
    try:
        async for text, tokens, finish in text_pieces(groups):
            yield sse(head | {"text_output": prefix + text, "finish_reason": finish, "tokens": tokens})
            prefix = ""
    except Exception as e:  # the stream has started: the error travels as an event
        stream_failed(x, e)
        yield sse({"error": str(e)})


def _documented(response: type[BaseModel], streamed: bool) -> dict[str, Any]:
    """The route's OpenAPI: its body (read by the handler itself, extra properties being parameters)."""
    body = {"content": {"application/json": {"schema": GenerateExtensionRequest.model_json_schema()}}}
    return {
        "response_model": response,
        "responses": STREAMED if streamed else {},
        "openapi_extra": {"requestBody": {"required": True, **body}},
    }


def _handlers(stream: bool) -> tuple[Callable[..., Awaitable[Response]], Callable[..., Awaitable[Response]]]:
    """The route handlers of one URL: the highest version, and a pinned one."""

    async def highest(request: Request, name: str, c: Collaborators = Depends(served)) -> Response:
        return await generate(request, c, name, None, stream)

    async def pinned(
        request: Request, name: str, version: str, c: Collaborators = Depends(served)
    ) -> Response:
        return await generate(request, c, name, version, stream)

    return highest, pinned


for _stream, _suffix, _what in (
    (False, "generate", "Triton's generate extension: text_input and parameters in, text_output out"),
    (True, "generate_stream", "The generate extension, streamed as Server-Sent Events"),
):
    _highest, _pinned = _handlers(_stream)
    _doc = _documented(GenerateExtensionResponse, streamed=_stream)
    router.add_api_route(
        f"/models/{{name}}/{_suffix}", _highest, methods=["POST"], summary=f"{_what}.", **_doc
    )
    router.add_api_route(
        f"/models/{{name}}/versions/{{version}}/{_suffix}",
        _pinned,
        methods=["POST"],
        summary=f"{_what}, with a pinned version.",
        **_doc,
    )
