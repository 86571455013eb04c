"""The route class of the task endpoints: JSON bytes in, JSON bytes out, nothing solved per request.

FastAPI prepares an endpoint's arguments anew for every request: it walks the dependency graph, parses
the body with `json.loads`, validates the resulting dict, then validates the return value against the
response model before encoding it. That was a third of the event loop's time per classify request. Every
task endpoint takes the same three things, `(body, request, c)`: its JSON body as a pydantic model, the
request, and the collaborators. This class hands them over directly: pydantic parses and validates the
raw bytes in one pass, and the response model's own serializer writes the answer. The signature is still
FastAPI's to read, so /docs and the OpenAPI schema are unchanged, and so are the errors (a bad body is the
same RequestValidationError, answered by the same handler). Once the body is read, a client that goes
away cancels the endpoint's work (service.api.disconnect).
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Coroutine
from typing import Any, get_type_hints

from fastapi.exceptions import RequestValidationError
from fastapi.routing import APIRoute
from pydantic import TypeAdapter, ValidationError
from starlette.requests import Request
from starlette.responses import Response

from service.api.deps import json_collaborators
from service.api.disconnect import until_disconnect

TASK_PARAMETERS = ["body", "request", "c"]


def parse_body(adapter: TypeAdapter[Any], raw: bytes) -> Any:
    """The body as the endpoint's model; errors located under `body`, as FastAPI reports them."""
    if not raw:
        raise RequestValidationError([{"type": "missing", "loc": ("body",), "msg": "Field required"}])
    try:
        return adapter.validate_json(raw)
    except ValidationError as e:
        errors = e.errors(include_url=False)
        raise RequestValidationError([{**err, "loc": ("body", *err["loc"])} for err in errors]) from None


class TaskRoute(APIRoute):
    """For endpoints `async def f(body: Model, request: Request, c: Collaborators = Depends(...))`."""

    def get_route_handler(self) -> Callable[[Request], Coroutine[Any, Any, Response]]:
        parameters = list(inspect.signature(self.endpoint).parameters)
        if parameters != TASK_PARAMETERS:
            raise TypeError(f"{self.path}: a task endpoint takes {TASK_PARAMETERS}, not {parameters}")
        body = TypeAdapter(get_type_hints(self.endpoint)["body"])
        answer = TypeAdapter(self.response_model if self.response_model is not None else Any)
        endpoint, status = self.endpoint, self.status_code or 200

        async def handle(request: Request) -> Response:
            c = await json_collaborators(request)  # 415 before the body is read
            parsed = parse_body(body, await request.body())
            work = endpoint(body=parsed, request=request, c=c)
            result = await until_disconnect(request.scope, request.receive, work)
            if isinstance(result, Response):  # a stream
                return result
            return Response(answer.dump_json(result), status_code=status, media_type="application/json")

        return handle
