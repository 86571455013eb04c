"""The one table that maps domain errors to HTTP status codes and a clear message."""

from __future__ import annotations

import logging

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

from service.api.deps import UnsupportedMediaTypeError
from service.batching import BatcherClosedError, DeadlineExceededError, QueueFullError
from service.engine import EngineError
from service.processors.common import InvalidInputError
from service.registry import ModelNotFoundError, WrongTaskError

log = logging.getLogger(__name__)


STATUS: dict[type[Exception], tuple[int, str]] = {
    InvalidInputError: (422, "validation"),
    WrongTaskError: (422, "validation"),
    ModelNotFoundError: (404, "not_found"),
    UnsupportedMediaTypeError: (415, "unsupported_media_type"),
    QueueFullError: (429, "overloaded"),
    BatcherClosedError: (503, "unavailable"),
    DeadlineExceededError: (504, "timeout"),
    EngineError: (500, "backend"),
}


def error_response(
    status: int, error_type: str, message: str, headers: dict[str, str] | None = None
) -> JSONResponse:
    return JSONResponse({"error": message, "error_type": error_type}, status_code=status, headers=headers)


def _describe_validation(exc: RequestValidationError) -> str:
    parts = []
    for err in exc.errors():
        loc = ".".join(str(x) for x in err.get("loc", ()) if x != "body") or "body"
        if err.get("type") == "json_invalid":
            parts.append(f"malformed JSON body ({err.get('ctx', {}).get('error', 'cannot parse')})")
            continue
        if err.get("type") == "missing" and tuple(err.get("loc", ())) == ("body",):
            parts.append("the request body is empty: send a JSON object")
            continue
        message = str(err.get("msg", "invalid")).removeprefix("Value error, ")
        parts.append(f"{loc}: {message}")
    return "; ".join(parts) or "invalid request"


def install_error_handlers(app: FastAPI) -> None:
    async def on_domain_error(request: Request, exc: Exception) -> JSONResponse:
        for kind, (status, error_type) in STATUS.items():
            if isinstance(exc, kind):
                headers = None
                if isinstance(exc, QueueFullError):
                    headers = {"Retry-After": str(max(1, round(exc.retry_after_s)))}
                if status >= 500:
                    log.error("%s %s failed: %s", request.method, request.url.path, exc)
                return error_response(status, error_type, str(exc), headers)
        raise exc  # pragma: no cover - only registered for the kinds above

    async def on_validation_error(request: Request, exc: RequestValidationError) -> JSONResponse:
        return error_response(422, "validation", _describe_validation(exc))

    async def on_http_error(request: Request, exc: StarletteHTTPException) -> JSONResponse:
        return error_response(exc.status_code, "http", str(exc.detail), getattr(exc, "headers", None))

    for kind in STATUS:
        app.add_exception_handler(kind, on_domain_error)
    app.add_exception_handler(RequestValidationError, on_validation_error)  # type: ignore[arg-type]
    app.add_exception_handler(StarletteHTTPException, on_http_error)  # type: ignore[arg-type]
