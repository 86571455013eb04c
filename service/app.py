"""The app factory and its lifespan: load the repository, warm up, start batchers; drain on shutdown."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager

from fastapi import FastAPI

from service.api import add_routes
from service.api.access import AccessMiddleware
from service.api.auth import ApiKeyMiddleware, load_api_keys
from service.api.deps import Collaborators
from service.api.drain import DrainGate, DrainMiddleware
from service.api.errors import install_error_handlers
from service.api.limits import BodyLimitMiddleware
from service.api.middleware import RequestMetricsMiddleware
from service.metrics import Metrics
from service.registry import ModelRegistry
from service.repository import RepositoryError, scan_repository
from service.request_context import TextLimits
from service.runtime import EngineFactory, ServedModel, load_model, ort_engine_factory
from service.settings import Settings

log = logging.getLogger(__name__)


class StartupError(RuntimeError):
    """The service cannot serve anything useful; start-up stops with this message."""


def load_models(settings: Settings, metrics: Metrics, engine_factory: EngineFactory) -> list[ServedModel]:
    scan = scan_repository(settings.model_repository)
    for error in scan.errors:
        log.error("skipping a broken model version: %s", error)
    if scan.errors and settings.strict_repository:
        raise StartupError("; ".join(str(e) for e in scan.errors))
    if not scan.versions:
        problems = "; ".join(str(e) for e in scan.errors) or "no <name>/<version>/manifest.json found"
        raise StartupError(f"no servable model in {settings.model_repository}: {problems}")
    models: list[ServedModel] = []
    for version in scan.versions:
        try:
            models.append(load_model(version, settings, metrics, engine_factory))
        except (RepositoryError, ValueError) as e:
            if settings.strict_repository:
                raise StartupError(str(e)) from e
            log.error("skipping %s: %s", version.directory, e)
    if not models:
        raise StartupError(f"no model in {settings.model_repository} could be loaded")
    return models


def create_app(
    settings: Settings,
    engine_factory: EngineFactory = ort_engine_factory,
    loaded: Callable[[], Awaitable[None]] | None = None,
) -> FastAPI:
    """`loaded`: awaited once the models are loaded, warm and ready, before the server listens (a worker
    waits there until its siblings are ready too, so the first burst of connections reaches all of them)."""
    metrics = Metrics()
    drain = DrainGate()
    try:
        api_keys = load_api_keys(settings)
    except ValueError as e:
        raise StartupError(str(e)) from e

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        app.state.ready = False
        models = await asyncio.to_thread(load_models, settings, metrics, engine_factory)
        app.state.registry = ModelRegistry(models)
        app.state.collaborators = Collaborators(settings, metrics, app.state.registry)
        if settings.warmup:
            for m in models:
                await asyncio.to_thread(m.warm_up)
        for m in models:
            m.start()
        app.state.ready = True
        log.info("ready: %s", ", ".join(f"{m.name} v{m.manifest.version}" for m in models))
        if loaded is not None:
            await loaded()
        try:
            yield
        finally:
            app.state.ready = False
            drain.begin()
            await asyncio.gather(*(m.close() for m in models))
            for m in models:
                m.executor.shutdown(wait=True)

    app = FastAPI(
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
    # before both, so a draining process reads nothing new; the request id and access line wrap it all.
    app.add_middleware(BodyLimitMiddleware, max_bytes=settings.max_body_bytes)
    if api_keys:
        app.add_middleware(ApiKeyMiddleware, keys=api_keys, protect_metrics=settings.protect_metrics)
    app.add_middleware(DrainMiddleware, gate=drain)
    app.add_middleware(RequestMetricsMiddleware, metrics=metrics)
    limits = TextLimits(max_chars=settings.max_text_chars, truncation=settings.truncation)
    app.add_middleware(AccessMiddleware, limits=limits)
    return app
