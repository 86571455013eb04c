"""text-embeddings-inference's `GET /info`: the model and the server's limits, in TEI's shape, for classifiers
and embedding models. TEI serves one model; here `model` names one, and may be left out when the server
serves one. (TEI's /tokenize is service.api.tokenizer's, beside vLLM's; /embed and /predict are their
tasks' endpoints: service.tasks.)"""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Depends, Query, Request
from pydantic import BaseModel, Field

from service.api.deps import collaborators
from service.api.schemas import ERRORS
from service.registry import AmbiguousModelError
from service.served import ServedModel
from service.settings import frontend_count
from service.tasks.contract import Collaborators, InvalidInputError

router = APIRouter(tags=["embeddings"])
DTYPES = {"fp32": "float32", "optimized": "float32", "fp16": "float16", "int8": "int8", "int4": "int4"}


def named_model(c: Collaborators, name: str | None) -> ServedModel:
    """The model named, or the one the server serves when none is."""
    names = c.registry.names()
    if name is None and len(names) != 1:
        raise AmbiguousModelError(f"{len(names)} models are served ({', '.join(names)}): name one in `model`")
    return c.registry.get(name or names[0])


# -- /info ------------------------------------------------------------------------------------------------


class Info(BaseModel):
    model_id: str = Field(description="The served model's name.")
    model_sha: str | None = Field(description="The tokenizer's sha256 (the weights are per variant).")
    model_dtype: str = Field(description="The variant served: float32, float16 or int8.")
    model_type: dict[str, Any] = Field(
        description='{"classifier": {"id2label": {...}}}, {"reranker": {"id2label": {...}}} (a classifier of '
        'one label) or {"embedding": {"pooling": "mean"}} (or cls, max)'
    )
    max_concurrent_requests: int = Field(description="Queued sequences per model before a 429.")
    max_input_length: int = Field(description="The model's window, in tokens.")
    max_batch_tokens: int
    max_batch_requests: int | None
    max_client_batch_size: int
    auto_truncate: bool = Field(description="Whether a text past the window is cut (else refused).")
    tokenization_workers: int = Field(description="HTTP frontends, each tokenizing its own requests.")
    version: str
    sha: str | None = None
    docker_label: str | None = None


@router.get(
    "/info",
    response_model=Info,
    responses=ERRORS,
    summary="text-embeddings-inference's /info: a classifier's or embedding model's limits.",
)
async def info(
    request: Request,
    model: str | None = Query(None, description="Model name; may be left out when one model is served."),
    c: Collaborators = Depends(collaborators),
) -> Info:
    served = named_model(c, model)
    m = served.manifest
    if m.task == "text-classification":  # one label: a cross-encoder, which TEI calls a reranker
        kind = "reranker" if m.cross_encoder else "classifier"
        model_type: dict[str, Any] = {kind: {"id2label": {str(i): m.labels[i] for i in sorted(m.labels)}}}
    elif m.embedding is not None:
        model_type = {"embedding": {"pooling": m.embedding.pooling}}
    else:
        raise InvalidInputError(
            f"TEI's /info describes classifiers and embedding models; {served.name} serves {m.task} "
            f"(GET /v1/models/{served.name} describes it)",
            param="model",
        )
    s = c.settings
    return Info(
        model_id=served.name,
        model_sha=m.tokenizer.sha256,
        model_dtype=DTYPES.get(served.variant, served.variant),
        model_type=model_type,
        max_concurrent_requests=s.max_queue,
        max_input_length=m.max_sequence_length,
        max_batch_tokens=s.max_batch_tokens,
        max_batch_requests=s.max_batch_size,
        max_client_batch_size=s.max_client_batch,
        auto_truncate=s.truncation == "truncate",
        tokenization_workers=frontend_count(s),
        version=request.app.version,
    )
