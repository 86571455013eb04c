"""Open Inference Protocol v2 (KServe / Triton HTTP/REST), so that `tritonclient.http` works unmodified.

Every model answers at a text-level interface for its task; each tensor's first axis is the batch:

- text-classification: TEXT BYTES [b] -> LABEL BYTES [b], SCORE FP32 [b] (top-1 probability),
  SCORES FP32 [b, num_labels] (every label's probability, in the manifest's label order).
- question-answering: QUESTION, CONTEXT BYTES [b] -> ANSWER BYTES [b], SCORE FP32 [b], START, END INT64 [b]
  (character offsets: CONTEXT[START:END] == ANSWER); parameters max_answer_length, doc_stride,
  handle_impossible_answer as in /v1/qa.
- fill-mask: TEXT BYTES [b] -> TOKEN_STR BYTES [b, k], TOKEN INT64 [b, k], SCORE FP32 [b, k],
  SEQUENCE BYTES [b, k] (the tokens decoded with the mask filled, as /v1/fill-mask's sequence);
  parameter top_k (default 5).
- text-generation: PROMPT BYTES [b] -> TEXT BYTES [b], TOKENS INT64 [b], FINISH_REASON BYTES [b];
  parameters max_new_tokens (default 32) and the sampling fields of /v1/generate (temperature, ...).

Requests are v2 JSON or the binary tensor data extension (see `v2_schemas`), optionally gzip/deflate
compressed; `outputs` selects outputs and how each travels (`binary_data`, `classification`);
`parameters.timeout` (microseconds) shortens the request's deadline. Results equal the /v1 endpoints'.
Failures are `{"error": message}`: 400 for any bad request (v2 has no 422), 404 for an unknown model or
version, 429 when overloaded, 503 while starting or draining, 504 past the deadline. Triton's model
configuration, repository index and statistics extensions are in `v2_extensions`.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Coroutine, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

import numpy as np
from fastapi import APIRouter, Depends, Request, Response
from fastapi.responses import JSONResponse
from fastapi.routing import APIRoute
from pydantic import BaseModel, ValidationError

from service.api.deps import Collaborators, collaborators, label_request
from service.api.disconnect import until_disconnect
from service.api.errors import response_for
from service.api.generate import sampling
from service.api.schemas import ClassifyRequest, FillMaskRequest, GenerateRequest, QARequest
from service.api.v2_schemas import (
    BINARY_HEADER,
    ErrorBody,
    ModelMetadata,
    OutputChoice,
    ServerMetadata,
    TensorError,
    TensorMetadata,
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
from service.batching import DeadlineExceededError
from service.processors.classification import classify
from service.processors.common import all_or_none
from service.processors.fill_mask import fill_mask
from service.processors.generation import complete, prepare
from service.processors.qa import Answer, SpanRules, answer_all
from service.registry import ModelNotFoundError, ModelRegistry
from service.served import ServedModel

log = logging.getLogger(__name__)

PLATFORM = "onnxruntime_onnx"
EXTENSIONS = [
    "binary_tensor_data",
    "classification",
    "parameters",
    "model_configuration",  # service.api.v2_extensions
    "model_repository",  # the index only: the repository is fixed at start-up
    "statistics",
]
M = TypeVar("M", bound=BaseModel)
_MAX_VERSION_DIGITS = 18  # any real version fits an int64; longer ones could exceed int()'s digit limit


class ServerNotReadyError(RuntimeError):
    """No model is loaded yet (start-up), so there is nothing to describe or run (HTTP 503)."""


# -- errors in the v2 shape -------------------------------------------------------------------------------


def v2_error(exc: Exception) -> JSONResponse | None:
    """The v2 answer to a failure: the shared table's status and headers, 400 where v1 says 422, and a
    `{"error": message}` body; None for what no table knows (a bug: the app answers 500)."""
    if isinstance(exc, TensorError):
        return JSONResponse({"error": str(exc)}, status_code=400)
    if isinstance(exc, ServerNotReadyError):
        return JSONResponse({"error": str(exc)}, status_code=503)
    shared = response_for(exc)
    if shared is None:
        return None
    status = 400 if shared.status_code == 422 else shared.status_code
    headers = {k: v for k, v in shared.headers.items() if k not in ("content-length", "content-type")}
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


# -- the per-task interface -------------------------------------------------------------------------------


@dataclass(frozen=True)
class Job:
    """One infer request, decoded: the model, its input texts and the request's parameters."""

    model: ServedModel
    texts: dict[str, list[str]]
    parameters: dict[str, Any]
    c: Collaborators
    timeout_s: float


Runner = Callable[[Job], Awaitable[dict[str, np.ndarray]]]


@dataclass(frozen=True)
class TaskInterface:
    inputs: tuple[str, ...]
    outputs: tuple[TensorMetadata, ...]
    parameters: tuple[str, ...]  # the request parameters passed on to the task, named as in /v1
    run: Runner


def _strings(values: Sequence[Any]) -> np.ndarray:
    array = np.empty(len(values), dtype=object)
    array[:] = list(values)
    return array


def label_order(model: ServedModel) -> list[str]:
    labels = model.manifest.labels
    return [labels[i] for i in sorted(labels)]


def _validated(schema: type[M], values: dict[str, Any], names: dict[str, str], index: int | None = None) -> M:
    """Check v2 values with the /v1 request schema, so both protocols share one set of limits."""
    try:
        return schema.model_validate(values)
    except ValidationError as e:
        parts = []
        for err in e.errors():
            loc = err["loc"]
            where = names.get(str(loc[-1]), f"parameters.{loc[-1]}") if loc else "request"
            positions = [x for x in loc if isinstance(x, int)] or ([index] if index is not None else [])
            if positions and not where.startswith("parameters."):
                where += f"[{positions[0]}]"
            parts.append(f"{where}: {str(err['msg']).removeprefix('Value error, ')}")
        raise TensorError("; ".join(parts)) from None


def _passed(job: Job, names: Sequence[str]) -> dict[str, Any]:
    return {k: job.parameters[k] for k in names if k in job.parameters}


async def _classify(job: Job) -> dict[str, np.ndarray]:
    texts = job.texts["TEXT"]
    _validated(ClassifyRequest, {"inputs": texts}, {"inputs": "TEXT"})
    labels = label_order(job.model)
    rows = await classify(job.model, texts, len(labels), job.c.metrics, job.timeout_s)
    scores = [{r["label"]: r["score"] for r in row} for row in rows]
    return {
        "LABEL": _strings([row[0]["label"] for row in rows]),
        "SCORE": np.array([row[0]["score"] for row in rows], dtype=np.float32),
        "SCORES": np.array([[s.get(label, 0.0) for label in labels] for s in scores], dtype=np.float32),
    }


async def _answer(job: Job) -> dict[str, np.ndarray]:
    questions, contexts = job.texts["QUESTION"], job.texts["CONTEXT"]
    pairs = [{"question": q, "context": c} for q, c in zip(questions, contexts, strict=True)]
    names = {"question": "QUESTION", "context": "CONTEXT", "inputs": "QUESTION/CONTEXT"}
    body = _validated(QARequest, {"inputs": pairs, **_passed(job, QA.parameters)}, names)
    rules = SpanRules(1, body.max_answer_length, body.handle_impossible_answer, body.doc_stride)
    results = await answer_all(job.model, body.pairs(), rules, job.c.metrics, job.timeout_s)
    best = [r[0] if r else Answer(answer="", score=0.0, start=0, end=0) for r in results]
    return {
        "ANSWER": _strings([a["answer"] for a in best]),
        "SCORE": np.array([a["score"] for a in best], dtype=np.float32),
        "START": np.array([a["start"] for a in best], dtype=np.int64),
        "END": np.array([a["end"] for a in best], dtype=np.int64),
    }


async def _fill_mask(job: Job) -> dict[str, np.ndarray]:
    texts = job.texts["TEXT"]
    body = _validated(
        FillMaskRequest, {"inputs": texts, **_passed(job, FILL_MASK.parameters)}, {"inputs": "TEXT"}
    )
    rows = await fill_mask(job.model, texts, body.top_k, job.c.metrics, job.timeout_s)
    shape = (len(rows), len(rows[0]))
    return {
        "TOKEN_STR": _strings([c["token_str"] for row in rows for c in row]).reshape(shape),
        "TOKEN": np.array([[c["token"] for c in row] for row in rows], dtype=np.int64).reshape(shape),
        "SCORE": np.array([[c["score"] for c in row] for row in rows], dtype=np.float32).reshape(shape),
        "SEQUENCE": _strings([c["sequence"] for row in rows for c in row]).reshape(shape),
    }


async def _generate(job: Job) -> dict[str, np.ndarray]:
    passed = _passed(job, GENERATION.parameters)
    bodies = [
        _validated(GenerateRequest, {"prompt": p, **passed}, {"prompt": "PROMPT"}, index=i)
        for i, p in enumerate(job.texts["PROMPT"])
    ]
    prepared = [
        prepare(job.model, b.prompt, sampling(b, b.max_new_tokens), b.truncate_prompt, job.c.metrics)
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
        "TEXT": _strings([r["generated_text"] for r in results]),
        "TOKENS": np.array([r["tokens"] for r in results], dtype=np.int64),
        "FINISH_REASON": _strings([r["finish_reason"] for r in results]),
    }


def _meta(name: str, datatype: str, rank: int = 1) -> TensorMetadata:
    return TensorMetadata(name=name, datatype=datatype, shape=[-1] * rank)


CLASSIFICATION = TaskInterface(
    ("TEXT",), (_meta("LABEL", "BYTES"), _meta("SCORE", "FP32"), _meta("SCORES", "FP32", 2)), (), _classify
)
QA = TaskInterface(
    ("QUESTION", "CONTEXT"),
    (_meta("ANSWER", "BYTES"), _meta("SCORE", "FP32"), _meta("START", "INT64"), _meta("END", "INT64")),
    ("max_answer_length", "doc_stride", "handle_impossible_answer"),
    _answer,
)
FILL_MASK = TaskInterface(
    ("TEXT",),
    tuple(
        _meta(n, t, 2)
        for n, t in (("TOKEN_STR", "BYTES"), ("TOKEN", "INT64"), ("SCORE", "FP32"), ("SEQUENCE", "BYTES"))
    ),
    ("top_k",),
    _fill_mask,
)
GENERATION = TaskInterface(
    ("PROMPT",),
    (_meta("TEXT", "BYTES"), _meta("TOKENS", "INT64"), _meta("FINISH_REASON", "BYTES")),
    (
        "max_new_tokens",
        "temperature",
        "top_k",
        "top_p",
        "repetition_penalty",
        "seed",
        "stop",
        "truncate_prompt",
    ),
    _generate,
)
TASKS: dict[str, TaskInterface] = {
    "text-classification": CLASSIFICATION,
    "question-answering": QA,
    "fill-mask": FILL_MASK,
    "text-generation": GENERATION,
}


def model_metadata(model: ServedModel, versions: list[int]) -> ModelMetadata:
    task = TASKS[model.manifest.task]
    outputs = [
        o.model_copy(update={"shape": [-1, len(model.manifest.labels)]}) if o.name == "SCORES" else o
        for o in task.outputs
    ]
    return ModelMetadata(
        name=model.name,
        versions=[str(v) for v in versions],
        platform=PLATFORM,
        inputs=[_meta(name, "BYTES") for name in task.inputs],
        outputs=outputs,
    )


# -- request plumbing -------------------------------------------------------------------------------------


async def served(request: Request) -> Collaborators:
    """The collaborators, or a 503 while start-up has not loaded the repository yet."""
    if getattr(request.app.state, "registry", None) is None:
        raise ServerNotReadyError("the server is starting: no model is loaded yet")
    return await collaborators(request)


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


def _versions(registry: ModelRegistry, name: str) -> list[int]:
    return [m.manifest.version for m in registry.versions(name)]


def _reply(content: bytes, header_length: int | None, accept_encoding: str | None) -> Response:
    headers = {} if header_length is None else {BINARY_HEADER: str(header_length)}
    content, encoding = compress(content, accept_encoding)
    if encoding is not None:
        headers["Content-Encoding"] = encoding
    media = "application/json" if header_length is None else "application/octet-stream"
    return Response(content, media_type=media, headers=headers)


def _as_classifications(
    tensors: dict[str, np.ndarray], choices: list[OutputChoice], model: ServedModel
) -> dict[str, np.ndarray]:
    out = dict(tensors)
    for choice in choices:
        if choice.classification:
            labels = label_order(model) if choice.name == "SCORES" else None
            out[choice.name] = classifications(tensors[choice.name], choice.classification, labels)
    return out


async def infer(request: Request, c: Collaborators, name: str, version: str | None) -> Response:
    model = find_model(c.registry, name, version)
    label_request(request, model)
    task = TASKS[model.manifest.task]
    body = decompress(
        await request.body(), request.headers.get("content-encoding"), c.settings.max_body_bytes
    )
    header, binary = split_body(body, request.headers.get(BINARY_HEADER))
    parsed = parse_request(header)
    texts = read_text_inputs(parsed, binary, task.inputs)
    choices = choose_outputs(parsed, [o.name for o in task.outputs])
    batch = len(texts[task.inputs[0]])
    if batch == 0:
        raise TensorError(f"input {task.inputs[0]}: the batch is empty")
    c.check_batch(batch)
    timeout_s = deadline_s(parsed.parameters, c.settings.request_timeout_s)
    tensors = await until_disconnect(
        request.scope, request.receive, task.run(Job(model, texts, parsed.parameters, c, timeout_s))
    )
    head: dict[str, Any] = {"model_name": model.name, "model_version": str(model.manifest.version)}
    if parsed.id is not None:
        head["id"] = parsed.id
    content, header_length = encode_response(head, _as_classifications(tensors, choices, model), choices)
    return _reply(content, header_length, request.headers.get("accept-encoding"))


# -- routes -----------------------------------------------------------------------------------------------


@router.get("", response_model=ServerMetadata, summary="Server metadata: name, version, extensions.")
async def server_metadata(request: Request) -> ServerMetadata:
    return ServerMetadata(name="distilserve", version=request.app.version, extensions=EXTENSIONS)


@router.get("/health/live", summary="Live: 200 while the process answers.")
@router.head("/health/live", include_in_schema=False)
async def server_live() -> Response:
    return Response(status_code=200)


@router.get("/health/ready", summary="Ready: 200 once models are loaded and warm, 400 otherwise.")
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


@router.get("/models/{name}/ready", summary="Model ready: 200, 400 if not ready, 404 if unknown.")
async def model_ready(request: Request, name: str) -> Response:
    return await _model_ready(request, name, None)


@router.get("/models/{name}/versions/{version}/ready", summary="Model version ready.")
async def model_version_ready(request: Request, name: str, version: str) -> Response:
    return await _model_ready(request, name, version)


@router.get("/models/{name}", response_model=ModelMetadata, summary="Model metadata: the task's tensors.")
async def get_model_metadata(name: str, c: Collaborators = Depends(served)) -> ModelMetadata:
    return model_metadata(find_model(c.registry, name, None), _versions(c.registry, name))


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
