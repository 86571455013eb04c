"""What a served task is to the rest of the service, and what the service hands a task.

A task module (service/tasks/<task>.py) declares one `ServedTask`: its JSON endpoints, its Open Inference
Protocol v2 interface, and what it asks of the engine. The HTTP layer (service.api) turns the endpoints into
routes and the v2 interface into /v2 infer and metadata; the engine (service.runtime) reads the engine asks.
Nothing here imports FastAPI: the engine core process reads the task table too, and never loads a web
framework.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Annotated, Any, Literal

import numpy as np
from pydantic import BaseModel, BeforeValidator, ConfigDict, Field, model_validator

from service.exchange import Exchange
from service.runtime import EngineAsks

if TYPE_CHECKING:
    from service.cascade import Pairs
    from service.metrics import Metrics
    from service.registry import ModelRegistry
    from service.served import ServedModel
    from service.settings import Settings
    from service.tasks.retrieval import PassageCache


class InvalidInputError(ValueError):
    """Well-formed JSON asking for something the model cannot do (HTTP 422; 400 on OpenAI's routes).

    `param`: the request field at fault, where known; OpenAI's error shape names it for its clients."""

    def __init__(self, message: str, param: str | None = None) -> None:
        super().__init__(message)
        self.param = param


class TensorError(ValueError):
    """A request that does not fit the v2 protocol or the model's v2 interface (HTTP 400)."""


# -- what every task's request shares ---------------------------------------------------------------------


def _texts(value: Any) -> str | list[str]:
    """One clear message for every wrong shape of `inputs`, instead of pydantic's per-union-branch list."""
    if isinstance(value, str):
        if not value.strip():
            raise ValueError("the text is empty")
        return value
    if isinstance(value, list):
        if not value:
            raise ValueError("the list of texts is empty")
        for i, item in enumerate(value):
            if not isinstance(item, str):
                raise ValueError(f"item {i} is {type(item).__name__}, expected a string")
            if not item.strip():
                raise ValueError(f"item {i} is an empty text")
        return value
    raise ValueError(f"expected a string or a list of strings, got {type(value).__name__}")


Texts = Annotated[str | list[str], BeforeValidator(_texts)]


class ModelRequest(BaseModel):
    """A request body that may pin the model and its version."""

    model_config = ConfigDict(extra="forbid", strict=True)

    model: str | None = Field(None, description="Model name; default: the first model serving the task.")
    version: int | None = Field(None, ge=1, description="Pin a model version; default: the highest.")


Priority = Annotated[
    int,
    Field(
        ge=-1000,
        le=1000,
        description="Where this request's engine work stands in the queues, as vLLM's `priority`: lower "
        "goes first (default 0); within one priority, first come first served. A student's unsure inputs "
        "keep it at the teacher's queue.",
    ),
]


class TeiRequest(BaseModel):
    """What text-embeddings-inference's requests share (/embed, /predict): its truncation fields; fields TEI
    knows and distilserve does not are ignored, as TEI ignores them."""

    model_config = ConfigDict(extra="ignore", strict=True)

    truncate: bool | None = Field(
        None,
        description="Cut texts past the model's window; false: refuse them (413). Default: the server's "
        "DISTILSERVE_TRUNCATION.",
    )
    truncation_direction: Literal["right", "Right"] = Field("right", description="Only right is supported.")
    priority: Priority = 0


class TeiEmbeddingRequest(TeiRequest):
    """TEI's requests to an embedding model (/embed, /similarity): `prompt_name` (its models' stored
    prefixes) is refused by name, and `model` is distilserve's own."""

    prompt_name: str | None = Field(None, description="Not supported: must be null.")
    model: str | None = Field(None, description="Model name; default: the first embedding model.")

    @model_validator(mode="after")
    def _no_prompts(self) -> TeiEmbeddingRequest:
        if self.prompt_name is not None:
            raise ValueError("prompt_name is not supported: the model has no prompts")
        return self


CascadeBudget = Annotated[
    float | None,
    Field(
        gt=0,
        description="How long this request may take, from when its engine work begins, before the "
        "teacher starts on its unsure inputs; past it the student's answers stand "
        "(X-Distilserve-Teacher-Busy). Default: the server's DISTILSERVE_CASCADE_BUDGET_MS.",
    ),
]


class CascadeRequest(ModelRequest):
    """A request a student may hand in part to its teacher (service.cascade)."""

    cascade_threshold: float | None = Field(
        None,
        ge=0.0,
        le=1.0,
        description="Inputs whose best answer scores below this go to the student's teacher; default: the "
        "pair's calibrated threshold (0: the student answers everything). No effect without a teacher.",
    )
    cascade_budget_ms: CascadeBudget = None
    priority: Priority = 0


@dataclass(frozen=True)
class Collaborators:
    """What every task endpoint is handed besides its body and its exchange, built once at start-up."""

    settings: Settings
    metrics: Metrics
    registry: ModelRegistry
    pairs: Pairs  # each student's teacher (service.cascade)
    passages: PassageCache  # passage embeddings for retrieve-then-read QA (service.tasks.retrieval)

    def resolve(self, task: str, name: str | None, version: int | None, x: Exchange) -> ServedModel:
        """The model that answers (service.registry's rules); the exchange is told which it is."""
        model = self.registry.resolve(task, name, version)
        x.serve(model.name, model.manifest.task, model.stats)
        return model

    def check_batch(self, count: int, x: Exchange) -> None:
        """Refuse more than the per-request cap; note the request's batch (the model's inference count)."""
        if count > self.settings.max_client_batch:
            raise InvalidInputError(
                f"inputs: {count} items, at most {self.settings.max_client_batch} per request"
            )
        x.items = count

    def texts(self, inputs: str | list[str], x: Exchange) -> list[str]:
        texts = [inputs] if isinstance(inputs, str) else inputs
        self.check_batch(len(texts), x)
        return texts


# -- the /v1 (and OpenAI) endpoints -----------------------------------------------------------------------


@dataclass(frozen=True)
class EventStream:
    """What an endpoint returns to stream: Server-Sent Events, each chunk one write."""

    chunks: AsyncIterator[bytes]


Handler = Callable[[Any, Exchange, Collaborators], Awaitable[Any]]


@dataclass(frozen=True)
class Endpoint:
    """`POST path`: a JSON `body` in, `handle(body, exchange, collaborators)` -> the answer (or an
    EventStream). `response` documents the answer (None: undocumented); `errors` picks the error shape
    (ours or OpenAI's); `streams`: with `stream: true` the answer is server-sent events instead."""

    path: str
    body: type[BaseModel]
    response: Any
    summary: str
    handle: Handler
    errors: Literal["distilserve", "openai"] = "distilserve"
    tags: tuple[str, ...] = ("tasks",)
    streams: bool = False


# -- the Open Inference Protocol v2 interface -------------------------------------------------------------


class TensorMetadata(BaseModel):
    """One input or output as model metadata lists it; -1 marks a variable dimension."""

    name: str
    datatype: str
    shape: list[int]


def tensor(name: str, datatype: str, rank: int = 1) -> TensorMetadata:
    return TensorMetadata(name=name, datatype=datatype, shape=[-1] * rank)


# A cascade task's v2 output: the name of the model that answered each input (its student, or the teacher
# for an unsure one), what /v1's `model` says per result.
ANSWERED_BY = tensor("MODEL", "BYTES")


@dataclass(frozen=True)
class V2Job:
    """One infer request, decoded: the model, its input texts and the request's parameters."""

    model: ServedModel
    texts: dict[str, list[str]]
    parameters: dict[str, Any]
    c: Collaborators
    timeout_s: float
    x: Exchange


@dataclass(frozen=True)
class V2Interface:
    inputs: tuple[str, ...]  # BYTES tensors of texts, each [batch]
    outputs: tuple[TensorMetadata, ...]
    parameters: tuple[str, ...]  # the request parameters passed on to the task, named as in /v1
    run: Callable[[V2Job], Awaitable[dict[str, np.ndarray]]]
    # decoupled (gRPC ModelStreamInfer): the answer in pieces, each in `outputs`' shape; None: `run`'s, whole
    stream: Callable[[V2Job], AsyncIterator[dict[str, np.ndarray]]] | None = None


@dataclass(frozen=True)
class ServedTask:
    name: str  # as manifests name it
    endpoints: tuple[Endpoint, ...]
    v2: V2Interface
    engine: EngineAsks = field(default_factory=EngineAsks)
