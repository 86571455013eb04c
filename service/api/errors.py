"""The one table that maps domain errors to HTTP status codes and a clear message."""

from __future__ import annotations

import logging

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.requests import ClientDisconnect

from service.api.deps import UnsupportedMediaTypeError
from service.batch_policy import BatcherClosedError, DeadlineExceededError, QueueFullError
from service.engine import EngineError
from service.exchange import exchange_of
from service.ipc import EngineUnavailableError
from service.model_control import ModelControlError
from service.registry import AmbiguousModelError, ModelNotFoundError, WrongTaskError
from service.tasks.contract import InvalidInputError

log = logging.getLogger(__name__)


class PayloadTooLargeError(StarletteHTTPException):
    """The body is over the size limit (HTTP 413).

    An HTTPException because it is raised while FastAPI reads the body, which re-raises HTTPExceptions
    (anything else it would answer with 400).
    """

    def __init__(self, message: str) -> None:
        super().__init__(413, message)

    def __str__(self) -> str:
        return self.detail


class UnauthorizedError(Exception):
    """No API key, or not one of ours (HTTP 401 with a Bearer challenge)."""

    def __init__(self, message: str, challenge: str) -> None:
        super().__init__(message)
        self.challenge = challenge


class ShuttingDownError(Exception):
    """The process is draining for shutdown: new work goes elsewhere (HTTP 503, connection closed)."""


STATUS: dict[type[Exception], tuple[int, str]] = {
    InvalidInputError: (422, "validation"),
    WrongTaskError: (422, "validation"),
    AmbiguousModelError: (422, "validation"),
    ModelNotFoundError: (404, "not_found"),
    ModelControlError: (400, "model_control"),
    UnsupportedMediaTypeError: (415, "unsupported_media_type"),
    PayloadTooLargeError: (413, "too_large"),
    UnauthorizedError: (401, "unauthorized"),
    QueueFullError: (429, "overloaded"),
    BatcherClosedError: (503, "unavailable"),
    EngineUnavailableError: (503, "unavailable"),
    ShuttingDownError: (503, "unavailable"),
    DeadlineExceededError: (504, "timeout"),
    EngineError: (500, "backend"),
    ClientDisconnect: (499, "client_closed"),  # nginx's code; nobody reads it, the log and metrics do
}


OPENAI_PATHS = (
    "/v1/completions",
    "/v1/chat/completions",
    "/v1/embeddings",
    "/v1/models/",
    "/v1/score",  # vLLM's, as its rerank routes: its errors are OpenAI's shape
    "/score",
    "/v1/rerank",
    "/v2/rerank",
)
# TEI's /embed, /predict, /tokenize, /rerank and /similarity answer what its validation refuses (a text past
# the window, too many texts) with 413 and error_type "validation" (its router's status table); its clients
# expect that, as ours.
TEI_PATHS = ("/embed", "/predict", "/tokenize", "/rerank", "/similarity")

# Our (status, type) -> OpenAI's on its routes: OpenAI and vLLM answer a request they cannot serve with 400
# `invalid_request_error` (the openai client's BadRequestError; 422 would be UnprocessableEntityError, which
# code written against OpenAI does not catch). Our own /v1 routes keep 422.
OPENAI_STATUS: dict[tuple[int, str], tuple[int, str]] = {
    (422, "validation"): (400, "invalid_request_error"),
    (404, "not_found"): (404, "not_found_error"),
}
# The request field each domain error is about, for OpenAI's `param` (InvalidInputError carries its own).
PARAM: dict[type[Exception], str] = {
    WrongTaskError: "model",
    AmbiguousModelError: "model",
    ModelNotFoundError: "model",
}


def error_response(
    status: int,
    error_type: str,
    message: str,
    headers: dict[str, str] | None = None,
    path: str = "",
    param: str | None = None,
) -> JSONResponse:
    """`{"error", "error_type"}`; on OpenAI's routes OpenAI's own shape and status codes, where its clients
    look for the message (with ours, the openai client said only "Error code: 404") and `param`, the field
    at fault."""
    if path.startswith(OPENAI_PATHS):
        status, error_type = OPENAI_STATUS.get((status, error_type), (status, error_type))
        body: dict[str, object] = {
            "error": {"message": message, "type": error_type, "param": param, "code": None}
        }
    else:
        body = {"error": message, "error_type": error_type}
    return JSONResponse(body, status_code=status, headers=headers)


def _headers(exc: Exception) -> dict[str, str] | None:
    if isinstance(exc, QueueFullError | EngineUnavailableError):
        return {"Retry-After": str(max(1, round(exc.retry_after_s)))}
    if isinstance(exc, UnauthorizedError):
        return {"WWW-Authenticate": exc.challenge}
    if isinstance(exc, ShuttingDownError):
        return {"Connection": "close"}
    return None


def response_for(exc: Exception, path: str = "") -> JSONResponse | None:
    """The table's answer to `exc` on `path`, or None when it is not a domain error; middlewares use it
    too."""
    for kind, (status, error_type) in STATUS.items():
        if isinstance(exc, kind):
            if kind is InvalidInputError and path in TEI_PATHS:
                status = 413
            return error_response(status, error_type, str(exc), _headers(exc), path, _param(exc))
    return None


def _param(exc: Exception) -> str | None:
    if isinstance(exc, InvalidInputError):
        return exc.param
    return next((param for kind, param in PARAM.items() if isinstance(exc, kind)), None)


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


def _validation_param(exc: RequestValidationError) -> str | None:
    """The first offending field's dotted path (`messages.0.content`), as the message names it; None when
    the error is about the body as a whole (malformed JSON, a check across fields)."""
    for err in exc.errors():
        loc = [str(x) for x in err.get("loc", ()) if x != "body"]
        if loc:
            return ".".join(loc)
    return None


def install_error_handlers(app: FastAPI) -> None:
    async def on_domain_error(request: Request, exc: Exception) -> JSONResponse:
        response = response_for(exc, request.scope["path"])
        if response is None:  # pragma: no cover - only registered for the kinds above
            raise exc
        if response.status_code >= 500:
            request_id = exchange_of(request.scope).request_id or "-"
            log.error("%s %s failed (request %s): %s", request.method, request.url.path, request_id, exc)
        return response

    async def on_validation_error(request: Request, exc: RequestValidationError) -> JSONResponse:
        message, param = _describe_validation(exc), _validation_param(exc)
        return error_response(422, "validation", message, path=request.scope["path"], param=param)

    async def on_http_error(request: Request, exc: StarletteHTTPException) -> JSONResponse:
        headers = getattr(exc, "headers", None)
        return error_response(exc.status_code, "http", str(exc.detail), headers, request.scope["path"])

    for kind in STATUS:
        app.add_exception_handler(kind, on_domain_error)
    app.add_exception_handler(RequestValidationError, on_validation_error)  # type: ignore[arg-type]
    app.add_exception_handler(StarletteHTTPException, on_http_error)  # type: ignore[arg-type]
