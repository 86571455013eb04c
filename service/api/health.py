"""Liveness, readiness and the Prometheus scrape endpoint."""

from __future__ import annotations

from fastapi import APIRouter, Depends, Request, Response
from fastapi.responses import JSONResponse
from prometheus_client import CONTENT_TYPE_LATEST

from service.api.deps import get_metrics
from service.metrics import Metrics

router = APIRouter(tags=["health"])


# HEAD too (some load balancers and uptime checkers probe with it), out of the schema: one operation each.
@router.get("/health", summary="Alive: the process answers.")
@router.head("/health", include_in_schema=False)
async def health() -> dict[str, str]:
    return {"status": "ok"}


@router.get("/ready", summary="Ready: models loaded and warmed, the engine reachable, not draining.")
@router.head("/ready", include_in_schema=False)
async def ready(request: Request) -> JSONResponse:
    if not getattr(request.app.state, "ready", False):
        return JSONResponse({"status": "not ready"}, status_code=503)
    if not request.app.state.engine.available:  # the engine core is restarting
        return JSONResponse({"status": "engine unavailable"}, status_code=503)
    return JSONResponse({"status": "ready"})


@router.get("/metrics", summary="Prometheus metrics.", include_in_schema=False)
async def metrics(m: Metrics = Depends(get_metrics)) -> Response:
    return Response(m.exposition(), media_type=CONTENT_TYPE_LATEST)
