"""The task lane: a POST to a task endpoint goes from the service's own middlewares straight to its handler.

Starlette and FastAPI put nine ASGI layers between the server and a route: their error, telemetry and
body-size middlewares outside the app's own, then the exception middleware, an exit stack, the router's
matching, the route and its request/response wrappers. Each wraps `send` or copies the scope once more per
request; together they were ~10 % of a frontend's CPU on a classify request, the most-served path there is.
`ServiceApp` builds its middleware stack twice over the same middlewares: task POSTs take the lane (the
app's middlewares, then the handler), everything else (/docs, /v2, probes, /metrics, a wrong method on a
task path) takes the framework's full stack as before.

What the skipped layers did is kept: exceptions are answered by the app's own exception handlers, looked up
as Starlette looks them up, and an unexpected one is answered 500 by the exchange middleware (with the
request id) and re-raised for the server to log, as the framework's error middleware would.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Coroutine, Mapping
from typing import Any

from fastapi import FastAPI
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import Response
from starlette.types import ASGIApp, Receive, Scope, Send

from service.api.task_route import TaskRoute

Handler = Callable[[Request], Coroutine[Any, Any, Response]]


class TaskLane:
    """The innermost layer of the lane: the task route's handler, and the app's exception handlers."""

    def __init__(self, handlers: Mapping[str, Handler], exception_handlers: Mapping[Any, Callable]) -> None:
        self.handlers = handlers
        self.exception_handlers = exception_handlers

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        request = Request(scope, receive, send)
        try:
            response = await self.handlers[scope["path"]](request)
        except Exception as exc:
            handler = self._handler_for(exc)
            if handler is None:
                raise
            answer = handler(request, exc)
            response = await answer if inspect.isawaitable(answer) else answer
        # A response sends its status first: whatever fails after (a stream's body) only the server can
        # log, as the framework's wrapper would re-raise it too.
        await response(scope, receive, send)

    def _handler_for(self, exc: Exception) -> Callable | None:
        """Starlette's lookup: a handler for the HTTP status first, then the nearest class in the MRO."""
        if isinstance(exc, HTTPException) and exc.status_code in self.exception_handlers:
            return self.exception_handlers[exc.status_code]
        for kind in type(exc).__mro__:
            if kind in self.exception_handlers:
                return self.exception_handlers[kind]
        return None


class ByPath:
    """The outermost layer: task POSTs to the lane, everything else to the framework's stack."""

    def __init__(self, paths: frozenset[str], lane: ASGIApp, framework: ASGIApp) -> None:
        self.paths, self.lane, self.framework = paths, lane, framework

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http" and scope["method"] == "POST" and scope["path"] in self.paths:
            await self.lane(scope, receive, send)
        else:
            await self.framework(scope, receive, send)


class ServiceApp(FastAPI):
    """FastAPI with the task lane beside its stack (see the module's docstring)."""

    def build_middleware_stack(self) -> ASGIApp:
        framework = super().build_middleware_stack()
        routes = [r for r in self.router.routes if isinstance(r, TaskRoute)]
        handlers = {r.path: r.get_route_handler() for r in routes}
        lane: ASGIApp = TaskLane(handlers, dict(self.exception_handlers))
        for cls, args, kwargs in reversed(self.user_middleware):
            lane = cls(lane, *args, **kwargs)
        return ByPath(frozenset(handlers), lane, framework)
