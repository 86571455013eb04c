"""What routes may ask for; everything lives on `app.state`, built once in the lifespan.

Every dependency here is `async def` although none awaits: FastAPI runs a plain `def` dependency on a
worker thread, a thread hop (and a wake-up of the event loop) per request for reading an attribute.
"""

from __future__ import annotations

from dataclasses import dataclass

from fastapi import Request

from service.metrics import Metrics
from service.processors.common import InvalidInputError
from service.registry import ModelRegistry
from service.request_context import current
from service.served import ServedModel
from service.settings import Settings


class UnsupportedMediaTypeError(ValueError):
    """The body is not declared as JSON (HTTP 415)."""


@dataclass(frozen=True)
class Collaborators:
    """The three things every task route needs, and the request-size rules they share."""

    settings: Settings
    metrics: Metrics
    registry: ModelRegistry

    def check_batch(self, count: int) -> None:
        """Refuse more than the per-request cap; note the request's batch (the model's inference count)."""
        if count > self.settings.max_client_batch:
            raise InvalidInputError(
                f"inputs: {count} items, at most {self.settings.max_client_batch} per request"
            )
        current().items = count

    def texts(self, inputs: str | list[str]) -> list[str]:
        texts = [inputs] if isinstance(inputs, str) else inputs
        self.check_batch(len(texts))
        return texts


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


def label_request(request: Request, model: ServedModel) -> None:
    """Tell the metrics middleware which model and task this request was for, and where its statistics
    go (the object itself: no lookup per request)."""
    request.state.model = model.name
    request.state.task = model.manifest.task
    request.state.stats = model.stats


def require_json(request: Request) -> None:
    """Task endpoints take JSON only; say so instead of failing to parse a form or a file."""
    content_type = request.headers.get("content-type", "")
    if content_type.split(";")[0].strip().lower() != "application/json":
        raise UnsupportedMediaTypeError(
            f"content-type must be application/json, got {content_type or 'none'!r}"
        )
