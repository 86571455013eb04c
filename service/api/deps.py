"""What routes may ask for; everything lives on `app.state`, built once in the lifespan.

Every dependency here is `async def` although none awaits: FastAPI runs a plain `def` dependency on a
worker thread, a thread hop (and a wake-up of the event loop) per request for reading an attribute.
"""

from __future__ import annotations

from fastapi import Request

from service.metrics import Metrics
from service.registry import ModelRegistry
from service.tasks.contract import Collaborators


class UnsupportedMediaTypeError(ValueError):
    """The body is not declared as JSON (HTTP 415)."""


async def collaborators(request: Request) -> Collaborators:
    """Built once, when the lifespan has loaded the models (a frozen dataclass per request cost ~10 us)."""
    c: Collaborators = request.app.state.collaborators
    return c


async def json_collaborators(request: Request) -> Collaborators:
    """What a task route needs, for a JSON body only (415 otherwise). Dependencies run before FastAPI
    validates the body, so a form or a file gets the 415, not a 422 about its fields; one dependency
    instead of two saves FastAPI a resolution per request."""
    require_json(request)
    return await collaborators(request)


async def get_metrics(request: Request) -> Metrics:
    metrics: Metrics = request.app.state.metrics
    return metrics


async def get_registry(request: Request) -> ModelRegistry:
    registry: ModelRegistry = request.app.state.registry
    return registry


def require_json(request: Request) -> None:
    """Task endpoints take JSON only; say so instead of failing to parse a form or a file."""
    content_type = request.headers.get("content-type", "")
    if content_type.split(";")[0].strip().lower() != "application/json":
        raise UnsupportedMediaTypeError(
            f"content-type must be application/json, got {content_type or 'none'!r}"
        )
