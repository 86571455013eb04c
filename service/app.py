"""The app factory and its lifespan: connect to the engine (or load it here), serve; drain on shutdown."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from typing import Protocol

from fastapi import FastAPI

from service.api import add_routes
from service.api.access import ExchangeMiddleware
from service.api.auth import ApiKeyMiddleware, load_api_keys
from service.api.drain import DrainGate, DrainMiddleware
from service.api.errors import install_error_handlers
from service.api.limits import BodyLimitMiddleware
from service.api.task_lane import ServiceApp
from service.capture import TrafficCapture
from service.cascade import Pairs
from service.engine_plan import EngineFactory
from service.exchange import TextLimits
from service.ipc import Executions, IndexRow
from service.live_calibration import LiveCalibrations
from service.metrics import Metrics
from service.model_control import ModelControl
from service.registry import ModelRegistry
from service.runtime import StartupError, ort_engine_factory
from service.served import ServedModel, local_model
from service.settings import Settings
from service.startup import StartupClock
from service.tasks.contract import Collaborators
from service.tasks.retrieval import PassageCache
from service.tracing import setup_tracing

__all__ = ["StartupError", "create_app"]

log = logging.getLogger(__name__)


class EngineConnection(Protocol):
    """Where a frontend's models run: in this process, or in the engine core process (service.client)."""

    async def open(self) -> list[ServedModel]: ...

    def watch(self, on_change: Callable[[list[ServedModel]], None]) -> None:
        """`on_change(models)` runs whenever model control changes the served versions."""
        ...

    def index(self) -> list[IndexRow]:
        """Every version in the repository and its state (Triton's repository index)."""
        ...

    async def control(self, action: str, model: str) -> None:
        """Load or unload `model` (explicit model control); returns once the change serves."""
        ...

    @property
    def available(self) -> bool: ...

    async def executions(self) -> list[Executions]:
        """What the engine ran, per model version (Triton's statistics)."""
        ...

    async def close(self) -> None: ...


class LocalEngine:
    """The engine in this process: the models are loaded, warmed and batched here (tests, embedding)."""

    def __init__(self, settings: Settings, metrics: Metrics, engine_factory: EngineFactory) -> None:
        self.settings, self.metrics = settings, metrics
        self.model_control = ModelControl(settings, metrics, engine_factory)
        self._views: dict[tuple[str, int], ServedModel] = {}
        self._on_change: Callable[[list[ServedModel]], None] | None = None

    async def open(self) -> list[ServedModel]:
        await self.model_control.start(StartupClock("engine"))
        self.model_control.publish = self._publish
        await self._publish(False)
        return list(self._views.values())

    async def _publish(self, wait: bool) -> None:
        """Routing follows the served set at once: one process has nobody to wait for."""
        models = self.model_control.models
        keys = [(p.name, p.version) for p in self.model_control.placements()]
        views = {k: self._views.get(k) or local_model(models[k], self.settings, self.metrics) for k in keys}
        if views.keys() != self._views.keys():
            self._views = views
            if self._on_change is not None:
                self._on_change(list(views.values()))

    def watch(self, on_change: Callable[[list[ServedModel]], None]) -> None:
        self._on_change = on_change

    def index(self) -> list[IndexRow]:
        return self.model_control.index()

    async def control(self, action: str, model: str) -> None:
        if action == "load":
            await self.model_control.load(model)
        else:
            await self.model_control.unload(model)

    @property
    def available(self) -> bool:
        return True

    async def executions(self) -> list[Executions]:
        return [m.executions() for m in self.model_control.models.values()]

    async def close(self) -> None:
        await self.model_control.close()


def engine_connection(
    settings: Settings, metrics: Metrics, engine_factory: EngineFactory
) -> EngineConnection:
    if settings.engine_address:
        from service.client import RemoteEngine

        return RemoteEngine(settings, metrics)
    return LocalEngine(settings, metrics, engine_factory)


def traffic_capture(settings: Settings, metrics: Metrics) -> TrafficCapture | None:
    """This process's writer of captured traffic, where DISTILSERVE_CAPTURE_DIR names a directory."""
    if settings.capture_dir is None:
        return None
    try:
        return TrafficCapture(settings.capture_dir, int(settings.capture_max_mb * 2**20), metrics)
    except ValueError as e:
        raise StartupError(str(e)) from e


async def _start_grpc(app: FastAPI, settings: Settings, api_keys: tuple[str, ...]) -> object:
    """Imported here: grpc and the protocol's stubs load only where gRPC is served."""
    from service.api.grpc_v2 import start_grpc

    return await start_grpc(app, settings, api_keys)


def create_app(
    settings: Settings,
    engine_factory: EngineFactory = ort_engine_factory,
    loaded: Callable[[], Awaitable[None]] | None = None,
    grpc: bool = False,
) -> FastAPI:
    """`loaded`: awaited once the models are loaded, warm and ready, before the server listens (a worker
    waits there until its siblings are ready too, so the first burst of connections reaches all of them).
    `grpc`: serve the v2 gRPC service on `settings.grpc_port` too, from then until shutdown (a frontend of
    `python -m service`; an app built in a test binds nothing)."""
    tracing = setup_tracing("frontend")  # OTEL_EXPORTER_OTLP_(TRACES_)ENDPOINT: on; else None, free
    metrics = Metrics(tracing=tracing)  # in-process engine batches and gRPC requests find it there
    drain = DrainGate()
    try:
        api_keys = load_api_keys(settings)
    except ValueError as e:
        raise StartupError(str(e)) from e

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        app.state.ready = False
        capture = traffic_capture(settings, metrics)  # first: a directory it cannot write opens nothing
        calibrations: LiveCalibrations = {}  # what each pair's live calibration has seen, across reloads
        engine = engine_connection(settings, metrics, engine_factory)
        app.state.engine = engine
        clock = StartupClock("frontend")
        with clock.phase("engine"):  # the core's models (or, in-process, loading them here)
            models = await engine.open()
        passages = PassageCache(settings.passage_cache, metrics)

        def route_to(models: list[ServedModel]) -> None:
            """The registry, the pairs and what a request gets, all at once: a request sees one set."""
            registry = ModelRegistry(models)
            pairs = Pairs(registry, settings, metrics, capture, calibrations)
            app.state.registry = registry
            app.state.collaborators = Collaborators(settings, metrics, registry, pairs, passages)

        grpc_server = None
        try:  # from here on a failure closes what is open: engine threads left running would hold the exit
            route_to(models)
            engine.watch(route_to)
            app.state.ready = True
            log.info("ready: %s", ", ".join(f"{m.name} v{m.manifest.version}" for m in models))
            clock.report(metrics.startup_seconds)
            if loaded is not None:
                await loaded()
            grpc_server = await _start_grpc(app, settings, api_keys) if grpc and settings.grpc_port else None
            app.state.grpc = grpc_server
            yield
        finally:
            app.state.ready = False
            drain.begin()
            if grpc_server is not None:
                from service.api.grpc_v2 import stop_grpc

                await stop_grpc(grpc_server)
            await engine.close()
            if capture is not None:
                await asyncio.to_thread(capture.close)
            if tracing is not None:
                tracing.shutdown()

    app = ServiceApp(
        title="distilserve",
        version="0.1.0",
        description="Distilled transformer students on ONNX Runtime, with request batching.",
        lifespan=lifespan,
        # OpenTelemetry off: FastAPI would ask the global providers on every request (~10 % of a request's
        # framework time) although nothing here configures them; the service has its own Prometheus metrics.
        telemetry={"tracing": False, "metrics": False, "logs": False},
    )
    app.state.settings = settings
    app.state.metrics = metrics
    app.state.ready = False
    app.state.drain = drain
    install_error_handlers(app)
    add_routes(app)
    # Innermost first: the body cap and the key check run before any body is read; the drain gate
    # before both, so a draining process reads nothing new; the exchange (request id, access line, request
    # metrics) wraps it all.
    app.add_middleware(BodyLimitMiddleware, max_bytes=settings.max_body_bytes)
    if api_keys:
        app.add_middleware(ApiKeyMiddleware, keys=api_keys, protect_metrics=settings.protect_metrics)
    app.add_middleware(DrainMiddleware, gate=drain)
    limits = TextLimits(max_chars=settings.max_text_chars, truncation=settings.truncation)
    app.add_middleware(ExchangeMiddleware, limits=limits, metrics=metrics, tracing=tracing)
    return app
