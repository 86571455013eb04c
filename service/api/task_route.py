"""The task endpoints as routes: JSON bytes in, JSON bytes (or events) out, nothing solved per request.

Each task module declares its endpoints (service.tasks.contract.Endpoint); `TaskRoute` serves one. FastAPI
prepares an endpoint's arguments anew for every request: it walks the dependency graph, parses the body
with `json.loads`, validates the resulting dict, then validates the return value against the response
model before encoding it. That was a third of the event loop's time per classify request. Here pydantic
parses and validates the raw bytes in one pass, the task's handler gets its body, the request's exchange
and the collaborators, and the response model's own serializer writes the answer. FastAPI still reads a
signature of the declared shape, so /docs and the OpenAPI schema are unchanged, and so are the errors (a
bad body is the same RequestValidationError, answered by the same handler). Once the body is read, a
client that goes away cancels the handler's work (service.api.disconnect).
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Coroutine
from typing import Any

from fastapi import Depends
from fastapi.exceptions import RequestValidationError
from fastapi.routing import APIRoute
from pydantic import TypeAdapter, ValidationError
from starlette.requests import Request
from starlette.responses import Response, StreamingResponse

from service.api.deps import json_collaborators
from service.api.disconnect import until_disconnect
from service.api.schemas import ERRORS, OPENAI_ERRORS
from service.exchange import exchange_of
from service.tasks import TASKS
from service.tasks.contract import Collaborators, Endpoint, EventStream

SSE_HEADERS = {"Cache-Control": "no-cache", "X-Accel-Buffering": "no"}


def parse_body(adapter: TypeAdapter[Any], raw: bytes) -> Any:
    """The body as the endpoint's model; errors located under `body`, as FastAPI reports them."""
    if not raw:
        raise RequestValidationError([{"type": "missing", "loc": ("body",), "msg": "Field required"}])
    try:
        return adapter.validate_json(raw)
    except ValidationError as e:
        errors = e.errors(include_url=False)
        raise RequestValidationError([{**err, "loc": ("body", *err["loc"])} for err in errors]) from None


def _documented(endpoint: Endpoint) -> Callable[..., Coroutine[Any, Any, Any]]:
    """What FastAPI reads to document the route (its body and its 415 check); never called: the route's
    own handler serves it."""

    async def documented(body: Any, c: Collaborators) -> Any:
        raise AssertionError("TaskRoute serves this route")  # pragma: no cover

    keyword = inspect.Parameter.KEYWORD_ONLY
    documented.__signature__ = inspect.Signature(  # type: ignore[attr-defined]
        [
            inspect.Parameter("body", keyword, annotation=endpoint.body),
            inspect.Parameter("c", keyword, annotation=Collaborators, default=Depends(json_collaborators)),
        ]
    )
    return documented


STREAMED: dict[int | str, dict[str, Any]] = {
    200: {
        "description": "The answer; with `stream: true`, server-sent events (`data: {...}` lines, then "
        "`data: [DONE]` for the OpenAI endpoints).",
        "content": {"text/event-stream": {"schema": {}}},  # each event: a JSON object (or [DONE])
    }
}


class TaskRoute(APIRoute):
    """`POST` one task endpoint."""

    def __init__(self, endpoint: Endpoint) -> None:
        self.task_endpoint = endpoint  # before APIRoute's __init__, which asks for the handler
        super().__init__(
            endpoint.path,
            _documented(endpoint),
            methods=["POST"],
            name=endpoint.path.removeprefix("/v1/").replace("-", "_"),
            response_model=endpoint.response,
            responses=(OPENAI_ERRORS if endpoint.errors == "openai" else ERRORS)
            | (STREAMED if endpoint.streams else {}),
            summary=endpoint.summary,
            tags=list(endpoint.tags),
        )

    def get_route_handler(self) -> Callable[[Request], Coroutine[Any, Any, Response]]:
        spec = self.task_endpoint
        body = TypeAdapter(spec.body)
        answer = TypeAdapter(spec.response if spec.response is not None else Any)

        async def handle(request: Request) -> Response:
            c = await json_collaborators(request)  # 415 before the body is read
            parsed = parse_body(body, await request.body())
            x = exchange_of(request.scope)
            x.priority = getattr(parsed, "priority", 0)  # the request's place in the engine's queues
            work = spec.handle(parsed, x, c)
            result = await until_disconnect(request.scope, request.receive, work)
            if isinstance(result, EventStream):
                return StreamingResponse(result.chunks, media_type="text/event-stream", headers=SSE_HEADERS)
            return Response(answer.dump_json(result), media_type="application/json")

        return handle


def task_routes() -> list[TaskRoute]:
    """Every task's endpoints, in the task table's order."""
    return [TaskRoute(endpoint) for task in TASKS.values() for endpoint in task.endpoints]
