"""Sentence embeddings: texts -> one vector each, in OpenAI's and TEI's shapes and over v2.

`POST /v1/embeddings` is OpenAI's (`input` a text or a list, `encoding_format` float or base64, `dimensions`,
`usage`; errors in OpenAI's shape), so the official client's `embeddings.create` works unmodified; it asks for
base64 unless told otherwise. `POST /embed` is text-embeddings-inference's (`inputs`, `normalize`, `truncate`
-> a list of vectors; what TEI's validation refuses, such as a text past the window without `truncate`, is
413 with `{"error", "error_type"}`, as TEI answers). v2: TEXT BYTES [b] -> EMBEDDING FP32 [b, dim]
(parameter `dimensions`).

Ranking with the same vectors (rerank, score, similarity: Jina's, Cohere's, vLLM's and TEI's shapes) is
service.tasks.similarity's; its endpoints are this task's.

The graph pools and normalises (export.sentence_embedding), so the engine batches texts as for
classification and nothing here knows the pooling rule. `dimensions` keeps the first coordinates and
normalises again (OpenAI's shortened text-embedding-3 vectors): a unit vector's prefix, so it needs a
normalised model, and it can only shorten.
"""

from __future__ import annotations

import base64
from typing import TYPE_CHECKING, Annotated, Any, Literal

import numpy as np
from pydantic import BaseModel, BeforeValidator, Field
from typing_extensions import TypedDict  # pydantic reads only this one's fields on Python 3.11

from service.exchange import Exchange
from service.tasks import similarity
from service.tasks.common import passed, validated
from service.tasks.contract import (
    Collaborators,
    Endpoint,
    InvalidInputError,
    Priority,
    ServedTask,
    TeiEmbeddingRequest,
    Texts,
    V2Interface,
    V2Job,
    tensor,
)
from service.tasks.embedding_shadow import embedded_rows
from service.tasks.vectors import EMBEDDINGS, embedding_spec, l2_normalized, stacked

if TYPE_CHECKING:
    from service.manifest import EmbeddingSpec

NAME = EMBEDDINGS


def _no_token_ids(value: Any) -> Any:
    """OpenAI and TEI also take token ids (an array, or one per text): refused by name, not as 'not a
    string' (ids of which vocabulary? OpenAI's are tiktoken's, never this model's)."""
    if isinstance(value, list) and any(
        isinstance(item, list) or (isinstance(item, int) and not isinstance(item, bool)) for item in value
    ):
        raise ValueError("token-id inputs are not supported; send the text")
    return value


EmbeddingTexts = Annotated[Texts, BeforeValidator(_no_token_ids)]  # this check runs first


class EmbeddingsRequest(BaseModel):
    """OpenAI's /v1/embeddings request. Strict as OpenAI is; unknown fields are ignored, as OpenAI's are."""

    input: EmbeddingTexts = Field(
        ..., description="One text or a list of texts.", examples=[["A man plays the guitar."]]
    )
    model: str | None = Field(None, description="Model name; default: the first embedding model.")
    version: int | None = Field(None, ge=1, description="Pin a model version; default: the highest.")
    encoding_format: Literal["float", "base64"] = Field(
        "float", description="float: a list of numbers; base64: little-endian float32 bytes, base64."
    )
    dimensions: int | None = Field(
        None, ge=1, description="Keep the first N coordinates, normalised again (normalised models only)."
    )
    user: str | None = Field(None, description="Accepted and ignored.")
    priority: Priority = 0  # vLLM's embeddings request has it too


class EmbedRequest(TeiEmbeddingRequest):
    """TEI's /embed request."""

    inputs: EmbeddingTexts = Field(..., description="One text or a list of texts.")
    normalize: bool = Field(True, description="L2-normalised vectors (false: as pooled, before that).")


class EmbeddingObject(TypedDict):
    object: Literal["embedding"]
    index: int
    embedding: list[float] | str


class Usage(TypedDict):
    prompt_tokens: int
    total_tokens: int


class EmbeddingsResponse(TypedDict):
    object: Literal["list"]
    data: list[EmbeddingObject]
    model: str
    usage: Usage


# -- the shared path --------------------------------------------------------------------------------------


def check_dimensions(dimensions: int | None, spec: EmbeddingSpec) -> None:
    """Refuse a `dimensions` the model cannot give, before any work."""
    if dimensions is None or dimensions == spec.dimensions:
        return
    if dimensions > spec.dimensions:
        raise InvalidInputError(
            f"dimensions {dimensions}: this model's embeddings have {spec.dimensions}", param="dimensions"
        )
    if not spec.normalized:
        raise InvalidInputError(
            "dimensions: this model's embeddings are not normalised, so a prefix of one is no embedding",
            param="dimensions",
        )


def shortened(vectors: np.ndarray, dimensions: int | None) -> np.ndarray:
    """The first `dimensions` coordinates of each row, normalised again (checked by check_dimensions)."""
    if dimensions is None or dimensions == vectors.shape[1]:
        return vectors
    return l2_normalized(vectors[:, :dimensions])


def as_base64(row: np.ndarray) -> str:
    """OpenAI's base64 encoding: the vector's little-endian float32 bytes."""
    return base64.b64encode(row.astype("<f4").tobytes()).decode("ascii")


# -- the endpoints ----------------------------------------------------------------------------------------


async def handle_openai(body: EmbeddingsRequest, x: Exchange, c: Collaborators) -> EmbeddingsResponse:
    model = c.resolve(NAME, body.model, body.version, x)
    spec = embedding_spec(model)
    check_dimensions(body.dimensions, spec)
    texts = c.texts(body.input, x)
    _, rows, tokens = await embedded_rows(model, texts, None, c, x)
    vectors = shortened(rows, body.dimensions)
    data = [
        EmbeddingObject(
            object="embedding",
            index=i,
            embedding=as_base64(row) if body.encoding_format == "base64" else row.tolist(),
        )
        for i, row in enumerate(vectors)
    ]
    return EmbeddingsResponse(
        object="list",
        data=data,
        model=model.name,
        usage=Usage(prompt_tokens=tokens, total_tokens=tokens),
    )


async def handle_tei(body: EmbedRequest, x: Exchange, c: Collaborators) -> list[list[float]]:
    """TEI's answer: a list of vectors, one per text (a single text too). normalize=false gives the pooled
    vector before normalisation, which the graph of a normalising model exposes beside the normalised one;
    normalize=true normalises the vectors of a model that does not itself."""
    model = c.resolve(NAME, body.model, None, x)
    spec = embedding_spec(model)
    texts = c.texts(body.inputs, x)
    outputs, vectors, _ = await embedded_rows(model, texts, body.truncate, c, x)
    if body.normalize:
        return (vectors if spec.normalized else l2_normalized(vectors)).tolist()
    return stacked(outputs, spec.pooled_output or spec.output).tolist()


async def infer(job: V2Job) -> dict[str, np.ndarray]:
    texts = job.texts["TEXT"]
    body = validated(
        EmbeddingsRequest, {"input": texts, **passed(job, TASK.v2.parameters)}, {"input": "TEXT"}
    )
    spec = embedding_spec(job.model)
    check_dimensions(body.dimensions, spec)
    _, rows, _ = await embedded_rows(job.model, texts, None, job.c, job.x, timeout_s=job.timeout_s)
    return {"EMBEDDING": shortened(rows, body.dimensions)}


TASK = ServedTask(
    name=NAME,
    endpoints=(
        Endpoint(
            "/v1/embeddings",
            EmbeddingsRequest,
            EmbeddingsResponse,
            "OpenAI-compatible embeddings: one vector per text, as floats or base64.",
            handle_openai,
            errors="openai",
            tags=("embeddings",),
        ),
        Endpoint(
            "/embed",
            EmbedRequest,
            list[list[float]],
            "text-embeddings-inference's /embed: one vector per text.",
            handle_tei,
            tags=("embeddings",),
        ),
        *similarity.ENDPOINTS,
    ),
    v2=V2Interface(
        inputs=("TEXT",),
        outputs=(tensor("EMBEDDING", "FP32", 2),),
        parameters=("dimensions",),
        run=infer,
    ),
)
