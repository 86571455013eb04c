"""The Open Inference Protocol over gRPC (KServe's grpc_predict_v2.proto, served as Triton's
`inference.GRPCInferenceService`), so that `tritonclient.grpc` works unmodified.

Each frontend serves it on DISTILSERVE_GRPC_PORT beside HTTP, in the same event loop (grpc.aio) and with
the same collaborators; the frontends share the port with SO_REUSEPORT (grpc's default on Linux), as they
share HTTP's. An RPC is read into /v2's envelope and runs /v2's code (`v2.v2_job`, then the task's
`V2Interface`), so both protocols check the same rules and answer the same; only the wire differs:

- inputs: BYTES as `contents.bytes_contents` or as `raw_input_contents` (4-byte length-prefixed elements,
  what tritonclient.grpc sends); outputs always in `raw_output_contents`, as Triton answers
  (service.api.grpc_v2_wire reads and writes the messages).
- errors: /v2's status as a gRPC code (`grpc_v2_wire.STATUS_CODES`) with /v2's message; a 429's
  Retry-After travels as `retry-after` trailing metadata, and every answer carries `x-request-id`.
- limits: the body cap is the largest message received (grpc refuses more with RESOURCE_EXHAUSTED); the
  batch cap, text limits and deadline are /v2's, the deadline also shortened by the call's own.
- keys: `authorization: Bearer <key>` metadata, as HTTP's header; ServerLive and ServerReady stay open, as
  /v2/health/* do.
- model config, repository index and statistics: Triton's messages, made from what /v2 answers in JSON.
  Load and unload as over HTTP (service.model_control); shared memory, trace and log settings answer
  UNIMPLEMENTED.
- streaming (ModelStreamInfer, Triton's decoupled models): each request on the stream as ModelInfer, a
  generation prompt answered in pieces as its tokens come (service.api.grpc_stream).

ModelInfer counts in the request metrics and model statistics under /v2's HTTP status, and drains with
HTTP's requests (SIGTERM: new ones get UNAVAILABLE, admitted ones finish); every RPC writes an access line
(method POST, path /inference.GRPCInferenceService/<Method>, as HTTP/2 carries it) and, tracing on, a server
span of that name with an HTTP request's phases (service.tracing; a `traceparent` in its metadata honoured).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from datetime import UTC, datetime
from typing import Any, TypeVar

import grpc
from fastapi import FastAPI
from google.protobuf import json_format
from starlette.datastructures import Headers
from tritonclient.grpc import service_pb2, service_pb2_grpc

from service.api.access import (
    access_fields,
    access_log,
    exchange_attributes,
    record_request,
    request_id_from,
    request_phases,
)
from service.api.auth import bearer_of, digests, refusal
from service.api.drain import DrainGate
from service.api.errors import ShuttingDownError
from service.api.grpc_stream import stream_infer
from service.api.grpc_v2_wire import STATUS_CODES, Code, Failure, grpc_status, infer_response, read_request
from service.api.v2 import (
    EXTENSIONS,
    answer_parameters,
    as_classifications,
    find_model,
    loaded,
    model_metadata,
    v2_job,
    versions_of,
)
from service.api.v2_extensions import index_of, model_config, stats_of
from service.api.v2_schemas import TensorError
from service.exchange import Exchange, TextLimits
from service.metrics import Metrics
from service.registry import ModelNotFoundError
from service.runtime import StartupError
from service.settings import Settings
from service.tasks import TASKS
from service.tracing import Tracing, trace_id_of

log = logging.getLogger(__name__)

T = TypeVar("T")
SERVICE = "inference.GRPCInferenceService"
REQUEST_ID = "x-request-id"
STOP_GRACE_S = 5.0  # admitted calls were already waited for by the drain (they count in its gate)


# -- the service ----------------------------------------------------------------------------------------


class InferenceServicer(service_pb2_grpc.GRPCInferenceServiceServicer):
    """One frontend's gRPC service over the app's collaborators (`app.state`, built by the lifespan)."""

    def __init__(self, app: FastAPI, settings: Settings, keys: Sequence[str]) -> None:
        self.state = app.state
        self.version = app.version
        self.metrics: Metrics = app.state.metrics
        self.tracing: Tracing | None = self.metrics.tracing  # None: off
        self.gate: DrainGate = app.state.drain
        self.limits = TextLimits(max_chars=settings.max_text_chars, truncation=settings.truncation)
        self.digests = digests(keys) if keys else None

    # -- health and metadata

    async def ServerLive(self, request: Any, context: Any) -> Any:
        return await self._answer("ServerLive", context, lambda x: _live(), protected=False)

    async def ServerReady(self, request: Any, context: Any) -> Any:
        ready = bool(getattr(self.state, "ready", False))
        return await self._answer(
            "ServerReady",
            context,
            lambda x: _reply(service_pb2.ServerReadyResponse(ready=ready)),
            protected=False,
        )

    async def ModelReady(self, request: Any, context: Any) -> Any:
        return await self._answer("ModelReady", context, lambda x: _reply(self._model_ready(request)))

    async def ServerMetadata(self, request: Any, context: Any) -> Any:
        metadata = service_pb2.ServerMetadataResponse(
            name="distilserve", version=self.version, extensions=EXTENSIONS
        )
        return await self._answer("ServerMetadata", context, lambda x: _reply(metadata))

    async def ModelMetadata(self, request: Any, context: Any) -> Any:
        return await self._answer("ModelMetadata", context, lambda x: _reply(self._metadata(request)))

    # -- inference

    async def ModelInfer(self, request: Any, context: Any) -> Any:
        return await self._answer(
            "ModelInfer", context, lambda x: self._infer(request, context, x), work=True
        )

    async def ModelStreamInfer(self, request_iterator: Any, context: Any) -> AsyncIterator[Any]:
        async for response in stream_infer(self.state, self._serve, request_iterator, context):
            yield response

    # -- Triton's extensions

    async def ModelConfig(self, request: Any, context: Any) -> Any:
        return await self._answer("ModelConfig", context, lambda x: _reply(self._config(request)))

    async def ModelStatistics(self, request: Any, context: Any) -> Any:
        return await self._answer("ModelStatistics", context, lambda x: self._statistics(request))

    async def RepositoryIndex(self, request: Any, context: Any) -> Any:
        return await self._answer("RepositoryIndex", context, lambda x: _reply(self._index(request)))

    async def RepositoryModelLoad(self, request: Any, context: Any) -> Any:
        return await self._answer(
            "RepositoryModelLoad", context, lambda x: self._control("load", request.model_name)
        )

    async def RepositoryModelUnload(self, request: Any, context: Any) -> Any:
        return await self._answer(
            "RepositoryModelUnload", context, lambda x: self._control("unload", request.model_name)
        )

    # -- what the RPCs do

    def _model_ready(self, request: Any) -> Any:
        """Ready, or not (starting, draining, or no such model: tritonclient's is_model_ready says False for
        all three, as for /v2's 400 and 404)."""
        state = self.state
        if not getattr(state, "ready", False) or getattr(state, "registry", None) is None:
            return service_pb2.ModelReadyResponse(ready=False)
        try:
            find_model(state.registry, request.name, request.version or None)
        except ModelNotFoundError:
            return service_pb2.ModelReadyResponse(ready=False)
        return service_pb2.ModelReadyResponse(ready=True)

    def _metadata(self, request: Any) -> Any:
        c = loaded(self.state)
        model = find_model(c.registry, request.name, request.version or None)
        versions = [model.manifest.version] if request.version else versions_of(c.registry, request.name)
        metadata = model_metadata(model, versions)
        tensor = service_pb2.ModelMetadataResponse.TensorMetadata
        return service_pb2.ModelMetadataResponse(
            name=metadata.name,
            versions=metadata.versions,
            platform=metadata.platform,
            inputs=[tensor(name=t.name, datatype=t.datatype, shape=t.shape) for t in metadata.inputs],
            outputs=[tensor(name=t.name, datatype=t.datatype, shape=t.shape) for t in metadata.outputs],
        )

    async def _infer(self, request: Any, context: Any, x: Exchange) -> Any:
        c = loaded(self.state)
        model = find_model(c.registry, request.model_name, request.model_version or None)
        x.serve(model.name, model.manifest.task, model.stats)
        parsed, binary = read_request(request)
        job, choices = v2_job(c, model, parsed, binary, x, context.time_remaining())
        tensors = await TASKS[model.manifest.task].v2.run(job)
        outputs = as_classifications(tensors, choices, model)
        return infer_response(request.id, model, outputs, choices, answer_parameters(x))

    def _config(self, request: Any) -> Any:
        c = loaded(self.state)
        config = model_config(find_model(c.registry, request.name, request.version or None), c.settings)
        return json_format.ParseDict({"config": config.model_dump()}, service_pb2.ModelConfigResponse())

    async def _statistics(self, request: Any) -> Any:
        """Every model's (no name), every version of one (no version), or one version's."""
        c = loaded(self.state)
        if not request.name:
            if request.version:
                raise TensorError("statistics of a version need the model's name")
            models = c.registry.all()
        elif not request.version:
            models = c.registry.versions(request.name)
        else:
            models = [find_model(c.registry, request.name, request.version)]
        stats = await stats_of(self.state.engine, models)
        return json_format.ParseDict(stats.model_dump(), service_pb2.ModelStatisticsResponse())

    def _index(self, request: Any) -> Any:
        loaded(self.state)  # 503 while starting
        entry = service_pb2.RepositoryIndexResponse.ModelIndex
        index = index_of(self.state.engine, request.ready)
        return service_pb2.RepositoryIndexResponse(
            models=[entry(name=e.name, version=e.version, state=e.state, reason=e.reason) for e in index]
        )

    async def _control(self, action: str, name: str) -> Any:
        """Load or unload as /v2 does (explicit model control), the same errors as gRPC codes."""
        loaded(self.state)
        await self.state.engine.control(action, name)
        if action == "load":
            return service_pb2.RepositoryModelLoadResponse()
        return service_pb2.RepositoryModelUnloadResponse()

    # -- what every RPC shares: keys, drain, errors, metrics, the access line

    async def _answer(
        self,
        method: str,
        context: Any,
        run: Callable[[Exchange], Awaitable[T]],
        protected: bool = True,
        work: bool = False,
    ) -> T:
        """`run`'s answer, or the RPC aborted with /v2's status as a gRPC code."""
        x, outcome = await self._serve(method, context, run, protected, work)
        if isinstance(outcome, Failure):
            trailing = ((REQUEST_ID, x.request_id), *outcome.metadata)
            await context.abort(outcome.code, outcome.message, trailing_metadata=trailing)
            raise AssertionError("context.abort always raises")  # pragma: no cover
        context.set_trailing_metadata(((REQUEST_ID, x.request_id),))
        return outcome

    async def _serve(
        self,
        method: str,
        context: Any,
        run: Callable[[Exchange], Awaitable[T]],
        protected: bool = True,
        work: bool = False,
    ) -> tuple[Exchange, T | Failure]:
        """`run`'s answer or why it failed, with what every request shares: keys, the drain gate, metrics,
        its span and access line. `work`: a request for work, counted in the metrics and the drain gate."""
        metadata = {k: v for k, v in (context.invocation_metadata() or ()) if isinstance(v, str)}
        x = Exchange(request_id=request_id_from(Headers(metadata)), limits=self.limits)
        arrived, started = datetime.now(UTC), time.perf_counter()
        span = self._span(method, metadata, x, started)
        status: int | None = None
        admitted = False
        if work:
            self.metrics.in_flight.inc()
        try:
            if protected and self.digests is not None:
                error = refusal(bearer_of(metadata.get("authorization", "")), self.digests)
                if error is not None:
                    raise error
            if work:
                if self.gate.draining:
                    raise ShuttingDownError("the server is shutting down; send this elsewhere")
                self.gate.in_flight += 1
                admitted = True
            answer = await run(x)
            status = 200
            return x, answer
        except asyncio.CancelledError:  # the client left, or its deadline passed
            remaining = context.time_remaining()
            status = 504 if remaining is not None and remaining <= 0 else 499
            raise
        except Exception as exc:
            failure = self._failure(exc, method, x)
            status = failure.status
            return x, failure
        finally:
            if admitted:
                self.gate.in_flight -= 1
            elapsed = time.perf_counter() - started
            if work:
                self.metrics.in_flight.dec()
                record_request(self.metrics, x, status, elapsed)
            trace_id = self._trace(span, method, x, status, started + elapsed)
            self._log(method, context, x, status, arrived, elapsed, trace_id)

    @staticmethod
    def _failure(exc: Exception, method: str, x: Exchange) -> Failure:
        found = grpc_status(exc)
        if found is None:
            log.exception("gRPC %s failed (request %s)", method, x.request_id)
            return Failure(500, Code.INTERNAL, (), f"internal error (request {x.request_id})")
        status, code, extra = found
        if status >= 500:
            log.error("gRPC %s failed (request %s): %s", method, x.request_id, exc)
        return Failure(status, code, extra, str(exc))

    def _span(self, method: str, metadata: dict[str, str], x: Exchange, started: float) -> Any:
        """Tracing on: the RPC's server span (a `traceparent` in its metadata is its parent), and a sampled
        one records its phases as an HTTP request's do (service.tracing)."""
        if self.tracing is None:
            return None
        span = self.tracing.start(f"{SERVICE}/{method}", metadata, started)
        if span.is_recording():
            x.phases = []
        return span

    def _trace(self, span: Any, method: str, x: Exchange, status: int | None, ended: float) -> str | None:
        """The RPC's spans, as service.api.access writes an HTTP request's; its trace id."""
        if span is None or self.tracing is None:
            return None
        code = Code.OK if status == 200 else STATUS_CODES.get(status or 500, Code.UNKNOWN)
        attributes = {
            "rpc.system": "grpc",
            "rpc.service": SERVICE,
            "rpc.method": method,
            "rpc.grpc.status_code": code.value[0],
            "distilserve.status": status,  # /v2's HTTP status of the answer
            **exchange_attributes(x),
        }
        self.tracing.finish(span, request_phases(x, ended), attributes, ended)
        return trace_id_of(span)

    @staticmethod
    def _log(
        method: str,
        context: Any,
        x: Exchange,
        status: int | None,
        arrived: datetime,
        elapsed: float,
        trace_id: str | None = None,
    ) -> None:
        if not access_log.isEnabledFor(logging.INFO):  # the fields cost more than the check
            return
        scope = {"method": "POST", "path": f"/{SERVICE}/{method}"}
        fields = access_fields(scope, x, status, arrived, elapsed)
        fields["client"] = context.peer()
        if trace_id is not None:
            fields["trace_id"] = trace_id
        access_log.info("%s %s %s", "POST", scope["path"], status, extra={"access": fields})


async def _reply(message: T) -> T:
    return message


async def _live() -> Any:
    return service_pb2.ServerLiveResponse(live=True)


# -- the server -----------------------------------------------------------------------------------------


def grpc_address(host: str, port: int) -> str:
    return f"[{host}]:{port}" if ":" in host and not host.startswith("[") else f"{host}:{port}"


async def start_grpc(app: FastAPI, settings: Settings, keys: Sequence[str]) -> Any:
    """The frontend's gRPC server, listening on `grpc_port` beside its siblings (SO_REUSEPORT)."""
    server = grpc.aio.server(
        options=[
            ("grpc.so_reuseport", 1),
            ("grpc.max_receive_message_length", settings.max_body_bytes),
            ("grpc.max_send_message_length", -1),
        ]
    )
    service_pb2_grpc.add_GRPCInferenceServiceServicer_to_server(
        InferenceServicer(app, settings, keys), server
    )
    address = grpc_address(settings.host, settings.grpc_port)
    try:
        bound = server.add_insecure_port(address)
    except RuntimeError as e:
        raise StartupError(f"cannot serve gRPC on {address}: {e}") from e
    if not bound:
        raise StartupError(f"cannot serve gRPC on {address}")
    await server.start()
    log.info("gRPC (Open Inference Protocol) on %s", address)
    return server


async def stop_grpc(server: Any) -> None:
    """Refuse new calls, give those running a moment, then close."""
    await server.stop(STOP_GRACE_S)
