"""Open Inference Protocol v2 (KServe / Triton HTTP/REST), so that `tritonclient.http` works unmodified.

Every model answers at a text-level interface for its task, declared in its task module (service.tasks:
each module's docstring lists its tensors and parameters); each tensor's first axis is the batch.

Requests are v2 JSON or the binary tensor data extension (see `v2_schemas`), optionally gzip/deflate
compressed; `outputs` selects outputs and how each travels (`binary_data`, `classification`);
`parameters.timeout` (microseconds) shortens the request's deadline. Results equal the /v1 endpoints'.
Failures are `{"error": message}`: 400 for any bad request (v2 has no 422), 404 for an unknown model or
version, 429 when overloaded, 503 while starting or draining, 504 past the deadline. Triton's model
configuration, repository index and statistics extensions are in `v2_extensions`.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Coroutine
from typing import Any

import numpy as np
from fastapi import APIRouter, Depends, Request, Response
from fastapi.responses import JSONResponse
from fastapi.routing import APIRoute
from starlette.datastructures import State

from service.api.disconnect import until_disconnect
from service.api.errors import response_for
from service.api.v2_schemas import (
    BINARY_HEADER,
    ErrorBody,
    InferenceRequest,
    ModelMetadata,
    OutputChoice,
    ServerMetadata,
    TensorError,
    choose_outputs,
    classifications,
    compress,
    deadline_s,
    decompress,
    encode_response,
    parse_request,
    read_text_inputs,
    split_body,
)
from service.exchange import Exchange, exchange_of
from service.registry import ModelNotFoundError, ModelRegistry
from service.served import ServedModel
from service.tasks import TASKS
from service.tasks.common import label_order
from service.tasks.contract import Collaborators, V2Job, tensor

log = logging.getLogger(__name__)

PLATFORM = "onnxruntime_onnx"
EXTENSIONS = [
    "binary_tensor_data",
    "classification",
    "generate",  # service.api.v2_generate
    "parameters",
    "model_configuration",  # service.api.v2_extensions
    "model_repository",  # the index only: the repository is fixed at start-up
    "statistics",
]
_MAX_VERSION_DIGITS = 18  # any real version fits an int64; longer ones could exceed int()'s digit limit


class ServerNotReadyError(RuntimeError):
    """No model is loaded yet (start-up), so there is nothing to describe or run (HTTP 503)."""


# -- errors in the v2 shape -------------------------------------------------------------------------------


def v2_status(exc: Exception) -> tuple[int, dict[str, str]] | None:
    """The v2 status of a failure and its headers (Retry-After, a Bearer challenge): the shared table's, 400
    where v1 says 422; None for what no table knows (a bug). gRPC answers the same (service.api.grpc_v2)."""
    if isinstance(exc, TensorError):
        return 400, {}
    if isinstance(exc, ServerNotReadyError):
        return 503, {}
    shared = response_for(exc)
    if shared is None:
        return None
    status = 400 if shared.status_code == 422 else shared.status_code
    headers = {k: v for k, v in shared.headers.items() if k not in ("content-length", "content-type")}
    return status, headers


def v2_error(exc: Exception) -> JSONResponse | None:
    """The v2 answer to a failure: `v2_status` and a `{"error": message}` body; None for what no table
    knows (a bug: the app answers 500)."""
    found = v2_status(exc)
    if found is None:
        return None
    status, headers = found
    return JSONResponse({"error": str(exc)}, status_code=status, headers=headers)


class V2Route(APIRoute):
    """A route whose domain errors answer in the v2 shape, leaving the app-wide (v1) table untouched."""

    def get_route_handler(self) -> Callable[[Request], Coroutine[Any, Any, Response]]:
        handler = super().get_route_handler()

        async def handle(request: Request) -> Response:
            try:
                return await handler(request)
            except Exception as exc:
                response = v2_error(exc)
                if response is None:
                    raise
                if response.status_code >= 500:
                    log.error("%s %s failed: %s", request.method, request.url.path, exc)
                return response

        return handle


ERRORS: dict[int | str, dict[str, Any]] = {code: {"model": ErrorBody} for code in (400, 404, 429, 503, 504)}


def v2_router() -> APIRouter:
    """A router of /v2 routes that answer in the v2 shape."""
    return APIRouter(
        prefix="/v2", tags=["v2 (Open Inference Protocol)"], route_class=V2Route, responses=ERRORS
    )


router = v2_router()
infer_router = v2_router()  # the hot path, matched before every v2 read (service.api.add_routes)


def model_metadata(model: ServedModel, versions: list[int]) -> ModelMetadata:
    task = TASKS[model.manifest.task].v2
    outputs = [
        o.model_copy(update={"shape": [-1, len(model.manifest.labels)]}) if o.name == "SCORES" else o
        for o in task.outputs
    ]
    return ModelMetadata(
        name=model.name,
        versions=[str(v) for v in versions],
        platform=PLATFORM,
        inputs=[tensor(name, "BYTES") for name in task.inputs],
        outputs=outputs,
    )


# -- request plumbing -------------------------------------------------------------------------------------


def loaded(state: State) -> Collaborators:
    """The app's collaborators, or a 503 while start-up has not loaded the repository yet."""
    if getattr(state, "registry", None) is None:
        raise ServerNotReadyError("the server is starting: no model is loaded yet")
    c: Collaborators = state.collaborators
    return c


async def served(request: Request) -> Collaborators:
    """The collaborators, or a 503 while start-up has not loaded the repository yet."""
    return loaded(request.app.state)


def find_model(registry: ModelRegistry, name: str, version: str | None) -> ServedModel:
    """The named model's version, or its highest without one; a version string that is no number is a
    version the model does not have (404), as one it lacks."""
    if version is None:
        return registry.get(name)
    if not _is_version_number(version):
        raise ModelNotFoundError(f"model {name!r} has no version {version!r}")
    return registry.get(name, int(version))


def _is_version_number(version: str) -> bool:
    """ASCII digits only ("²" and Arabic-Indic digits pass str.isdigit), few enough for int() to take."""
    return version.isascii() and version.isdigit() and len(version) <= _MAX_VERSION_DIGITS


def versions_of(registry: ModelRegistry, name: str) -> list[int]:
    return [m.manifest.version for m in registry.versions(name)]


def _reply(content: bytes, header_length: int | None, accept_encoding: str | None) -> Response:
    headers = {} if header_length is None else {BINARY_HEADER: str(header_length)}
    content, encoding = compress(content, accept_encoding)
    if encoding is not None:
        headers["Content-Encoding"] = encoding
    media = "application/json" if header_length is None else "application/octet-stream"
    return Response(content, media_type=media, headers=headers)


def answer_parameters(x: Exchange) -> dict[str, Any]:
    """The response's `parameters`: who answered (`answered_by`, the names X-Distilserve-Answered-By gives)
    and how many unsure inputs kept the student's answer because the teacher was busy (`teacher_busy`), so
    that gRPC clients, which see no HTTP headers, read the same."""
    parameters: dict[str, Any] = {}
    if x.answered_by:
        parameters["answered_by"] = ", ".join(x.answered_by)
    if x.teacher_busy:
        parameters["teacher_busy"] = x.teacher_busy
    return parameters


def as_classifications(
    tensors: dict[str, np.ndarray], choices: list[OutputChoice], model: ServedModel
) -> dict[str, np.ndarray]:
    """The task's outputs, those asked for as classifications turned into Triton's "value:index:label"."""
    out = dict(tensors)
    for choice in choices:
        if choice.classification:
            labels = label_order(model) if choice.name == "SCORES" else None
            out[choice.name] = classifications(tensors[choice.name], choice.classification, labels)
    return out


def v2_job(
    c: Collaborators,
    model: ServedModel,
    parsed: InferenceRequest,
    binary: bytes,
    x: Exchange,
    deadline_cap_s: float | None = None,
) -> tuple[V2Job, list[OutputChoice]]:
    """An infer request decoded into the job its task runs and the outputs it asked for.

    Both protocols come here: HTTP with its JSON header and binary tensor data, gRPC with its protobuf
    read into the same envelope (raw tensor contents as binary data), so one implementation checks every
    rule (inputs, shapes, batch cap, outputs, deadline). `deadline_cap_s`: the caller's own deadline (a
    gRPC deadline) shortens the server's too."""
    task = TASKS[model.manifest.task].v2
    texts = read_text_inputs(parsed, binary, task.inputs)
    choices = choose_outputs(parsed, [o.name for o in task.outputs])
    batch = len(texts[task.inputs[0]])
    if batch == 0:
        raise TensorError(f"input {task.inputs[0]}: the batch is empty")
    c.check_batch(batch, x)
    default_s = c.settings.request_timeout_s
    if deadline_cap_s is not None:
        default_s = min(default_s, deadline_cap_s)
    timeout_s = deadline_s(parsed.parameters, default_s)
    return V2Job(model, texts, parsed.parameters, c, timeout_s, x), choices


async def infer(request: Request, c: Collaborators, name: str, version: str | None) -> Response:
    model = find_model(c.registry, name, version)
    x = exchange_of(request.scope)
    x.serve(model.name, model.manifest.task, model.stats)
    body = decompress(
        await request.body(), request.headers.get("content-encoding"), c.settings.max_body_bytes
    )
    header, binary = split_body(body, request.headers.get(BINARY_HEADER))
    parsed = parse_request(header)
    job, choices = v2_job(c, model, parsed, binary, x)
    tensors = await until_disconnect(request.scope, request.receive, TASKS[model.manifest.task].v2.run(job))
    head: dict[str, Any] = {"model_name": model.name, "model_version": str(model.manifest.version)}
    if parsed.id is not None:
        head["id"] = parsed.id
    if parameters := answer_parameters(x):
        head["parameters"] = parameters
    content, header_length = encode_response(head, as_classifications(tensors, choices, model), choices)
    return _reply(content, header_length, request.headers.get("accept-encoding"))


# -- routes -----------------------------------------------------------------------------------------------


@router.get("", response_model=ServerMetadata, summary="Server metadata: name, version, extensions.")
async def server_metadata(request: Request) -> ServerMetadata:
    return ServerMetadata(name="distilserve", version=request.app.version, extensions=EXTENSIONS)


@router.get("/health/live", summary="Live: 200 while the process answers.", response_class=Response)
@router.head("/health/live", include_in_schema=False)
async def server_live() -> Response:
    return Response(status_code=200)


@router.get(
    "/health/ready",
    summary="Ready: 200 once models are loaded and warm, 400 otherwise.",
    response_class=Response,
)
@router.head("/health/ready", include_in_schema=False)
async def server_ready(request: Request) -> Response:
    return Response(status_code=200 if getattr(request.app.state, "ready", False) else 400)


async def _model_ready(request: Request, name: str, version: str | None) -> Response:
    """200 when ready; 400 (v2's "false") while starting or draining; 404 for an unknown model."""
    state = request.app.state
    if not getattr(state, "ready", False) or getattr(state, "registry", None) is None:
        return Response(status_code=400)
    find_model(state.registry, name, version)
    return Response(status_code=200)


@router.get(
    "/models/{name}/ready",
    summary="Model ready: 200, 400 if not ready, 404 if unknown.",
    response_class=Response,
)
async def model_ready(request: Request, name: str) -> Response:
    return await _model_ready(request, name, None)


@router.get(
    "/models/{name}/versions/{version}/ready", summary="Model version ready.", response_class=Response
)
async def model_version_ready(request: Request, name: str, version: str) -> Response:
    return await _model_ready(request, name, version)


@router.get("/models/{name}", response_model=ModelMetadata, summary="Model metadata: the task's tensors.")
async def get_model_metadata(name: str, c: Collaborators = Depends(served)) -> ModelMetadata:
    return model_metadata(find_model(c.registry, name, None), versions_of(c.registry, name))


@router.get("/models/{name}/versions/{version}", response_model=ModelMetadata, summary="Version metadata.")
async def get_model_version_metadata(
    name: str, version: str, c: Collaborators = Depends(served)
) -> ModelMetadata:
    model = find_model(c.registry, name, version)
    return model_metadata(model, [model.manifest.version])


@infer_router.post("/models/{name}/infer", summary="Infer with the highest version (JSON or binary tensors).")
async def infer_latest(request: Request, name: str, c: Collaborators = Depends(served)) -> Response:
    return await infer(request, c, name, None)


@infer_router.post("/models/{name}/versions/{version}/infer", summary="Infer with a pinned version.")
async def infer_version(
    request: Request, name: str, version: str, c: Collaborators = Depends(served)
) -> Response:
    return await infer(request, c, name, version)
