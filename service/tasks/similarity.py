"""Rerank, score and similarity: a query against documents, by an embedding model or a cross-encoder.

Search ranks cheaply first: each document embedded once (kept in the passage cache that retrieve-then-read QA
fills, service.tasks.retrieval), each query embedded and compared by cosine; then, where it pays, a
cross-encoder (a text-classification model of one label) reads each (query, document) pair together. In the
shapes clients already send:

- `POST /v1/rerank`, `/v2/rerank`, `/rerank` (Jina's and Cohere's, as vLLM serves them): `query`, `documents`
  (texts, or `{"text"}` objects), `top_n`, `return_documents` -> `{"id", "model", "usage", "results":
  [{"index", "relevance_score", "model", "document": {"text"}}]}`, best first.
- `POST /rerank` with `texts` instead of `documents` (text-embeddings-inference's): `return_text`,
  `truncate` -> `[{"index", "score", "model", "text"?}]`, best first.
- `POST /v1/score`, `/score` (vLLM's): `text_1` and `text_2`, each a text or a list: one against each (1:N)
  or pair by pair (N:N) -> `data: [{"index", "object": "score", "score"}]`.
- `POST /similarity` (TEI's): `{"inputs": {"source_sentence", "sentences"}}` -> `[float]`.

An embedding model's score is a cosine in [-1, 1] (TEI's `raw_scores` changes nothing); a cross-encoder's
is its relevance logit's sigmoid, or with `raw_scores` the logit. /similarity is TEI's, for embedding models
only. Without `model`: the first embedding model, else the first cross-encoder. A cross-encoder student
exported with its teacher ranks by the ranking cascade (service.ranking): the documents it cannot tell
apart from its best are read again by the teacher; each result's `model` says whose score it is (rerank
only: /score's scores are the named model's alone, as a client compares them with each other).
"""

from __future__ import annotations

import math
import time
import uuid
from collections.abc import Sequence
from typing import TYPE_CHECKING, Annotated, Literal, NotRequired

from pydantic import BaseModel, ConfigDict, Field, StringConstraints, model_validator
from typing_extensions import TypedDict  # pydantic reads only this one's fields on Python 3.11

from service.exchange import Exchange
from service.ranking import Ranked, rank
from service.tasks import retrieval
from service.tasks.common import run_texts
from service.tasks.contract import (
    CascadeBudget,
    Collaborators,
    Endpoint,
    InvalidInputError,
    Priority,
    TeiEmbeddingRequest,
    Texts,
)
from service.tasks.vectors import EMBEDDINGS, cosines

if TYPE_CHECKING:
    from service.served import ServedModel

Text = Annotated[str, StringConstraints(strict=True, min_length=1, pattern=r"\S")]


class Document(BaseModel):
    """A document as Cohere and Jina also send it: an object with its text."""

    model_config = ConfigDict(extra="ignore", strict=True)
    text: Text


class RerankRequest(BaseModel):
    """Jina's and Cohere's rerank request; fields they have and these models cannot use are ignored, as those
    servers ignore what they do not know."""

    model_config = ConfigDict(extra="ignore", strict=True)

    model: str | None = Field(None, description="Model name; default: the first embedding model.")
    query: Text = Field(..., description="What the documents are ranked against.", examples=["guitar"])
    documents: list[Text | Document] = Field(
        ..., description='The texts to rank (or {"text"} objects).', min_length=1
    )
    top_n: int | None = Field(None, ge=0, description="Return only the best N (default, or 0 as vLLM: all).")
    return_documents: bool = Field(True, description="Each result carries its document.")
    cascade_margin: float | None = Field(
        None,
        ge=0.0,
        description="distilserve's: a cross-encoder student's teacher reads again the documents whose "
        "relevance logit is within this of the student's best; default: the pair's calibrated margin (0: "
        "the student ranks alone). No effect without a teacher.",
    )
    cascade_budget_ms: CascadeBudget = None  # the documents the teacher reads again are its unsure inputs
    priority: Priority = 0

    def ranked(self) -> list[str]:
        return [d if isinstance(d, str) else d.text for d in self.documents]


class EitherRerankRequest(RerankRequest):
    """/rerank: Jina's and Cohere's request (`documents`), or text-embeddings-inference's (`texts`)."""

    documents: list[Text | Document] | None = Field(  # type: ignore[assignment]
        None, description="Jina's and Cohere's: the texts to rank (or {\"text\"} objects).", min_length=1
    )
    texts: list[Text] | None = Field(None, description="TEI's: the texts to rank.", min_length=1)
    return_text: bool = Field(False, description="TEI's: each result carries its text.")
    raw_scores: bool = Field(False, description="TEI's; cosines have no logits: no effect.")
    truncate: bool | None = Field(
        None, description="Cut texts past the model's window; false: refuse them. Default: the server's."
    )

    @model_validator(mode="after")
    def _one_list(self) -> EitherRerankRequest:
        if (self.documents is None) == (self.texts is None):
            raise ValueError("send the texts to rank in one of `documents` (Jina, Cohere) or `texts` (TEI)")
        return self

    def ranked(self) -> list[str]:
        return self.texts if self.texts is not None else super().ranked()


class RerankDocument(TypedDict):
    text: str


class RerankResult(TypedDict):
    index: int
    relevance_score: float
    model: str  # distilserve's: the model whose score this is (a ranking cascade's teacher, or its student)
    document: NotRequired[RerankDocument]


class RerankUsage(TypedDict):
    total_tokens: int  # tokens embedded for this request (a document from the cache costs none)


class RerankResponse(TypedDict):
    id: str
    model: str
    usage: RerankUsage
    results: list[RerankResult]


class TeiRank(TypedDict):
    index: int
    score: float
    model: str
    text: NotRequired[str]


class ScoreRequest(BaseModel):
    """vLLM's score request; its other fields are ignored."""

    model_config = ConfigDict(extra="ignore", strict=True)

    model: str | None = Field(None, description="Model name; default: the first embedding model.")
    priority: Priority = 0
    text_1: Texts = Field(..., description="A text, or a list of them.", examples=["A man plays guitar."])
    text_2: Texts = Field(
        ..., description="A text or a list: text_1's one text against each, or pair by pair."
    )


class ScoreData(TypedDict):
    index: int
    object: Literal["score"]
    score: float


class ScoreUsage(TypedDict):
    prompt_tokens: int
    total_tokens: int


class ScoreResponse(TypedDict):
    id: str
    object: Literal["list"]
    created: int
    model: str
    data: list[ScoreData]
    usage: ScoreUsage


class SimilarityInputs(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)
    source_sentence: Text
    sentences: list[Text] = Field(..., min_length=1)


class SimilarityRequest(TeiEmbeddingRequest):
    """TEI's /similarity request."""

    inputs: SimilarityInputs


def labelled(field: str, texts: str | list[str]) -> list[str]:
    """What messages call each text of a request field: `query`, or `documents[2]`."""
    return [field] if isinstance(texts, str) else [f"{field}[{i}]" for i in range(len(texts))]


def ranking_model(name: str | None, c: Collaborators, x: Exchange, cross: bool = True) -> ServedModel:
    """The model named, else the first embedding model, else (`cross`) the first cross-encoder."""
    if name is not None:
        model = c.registry.get(name)
        if model.manifest.task != EMBEDDINGS and not (cross and model.manifest.cross_encoder):
            can = "a sentence-embeddings model or a cross-encoder (a text-classification model of one label)"
            raise InvalidInputError(
                f"model {name!r} serves {model.manifest.task} ({len(model.manifest.labels)} labels); ranking "
                f"needs {can if cross else 'a sentence-embeddings model'}",
                param="model",
            )
    else:  # the first embedding model; with none served, the first cross-encoder; with neither, a 404
        crossing = sorted({m.name for m in c.registry.all() if cross and m.manifest.cross_encoder})
        serving = any(m.manifest.task == EMBEDDINGS for m in c.registry.all())
        model = c.registry.get(crossing[0]) if crossing and not serving else c.registry.resolve(EMBEDDINGS)
    x.serve(model.name, model.manifest.task, model.stats)
    x.answered_by = (model.name,)  # a ranking cascade (service.ranking) names its teacher too
    return model


async def _scores(
    model: ServedModel,
    queries: tuple[str, str | list[str]],
    documents: tuple[str, list[str]],
    truncate: bool | None,
    c: Collaborators,
    x: Exchange,
    by_pair: bool = False,
    raw: bool = False,
    indices: Sequence[int] | None = None,
) -> tuple[list[float], int]:
    """Each document's score against the query (`by_pair`: document i's against query i), and the tokens
    read; `indices`: of those documents only. Queries and documents come as (the request's field, its
    texts). An embedding model: the cosine of their vectors; a cross-encoder: the pair read together, its
    relevance's sigmoid (`raw`: the logit)."""
    firsts = [queries[1]] if isinstance(queries[1], str) else queries[1]
    picked = range(len(documents[1])) if indices is None else indices
    texts = [documents[1][i] for i in picked]
    every = labelled(*documents)
    labels = (labelled(*queries), [every[i] for i in picked])
    query_of = [i if by_pair else 0 for i in picked]
    if model.manifest.cross_encoder:
        c.check_batch(len(texts), x)
        pairs = [(firsts[q], d) for q, d in zip(query_of, texts, strict=True)]
        named = [f"{labels[0][q]} with {d}" for q, d in zip(query_of, labels[1], strict=True)]
        outputs, tokens = await run_texts(
            model, pairs, truncate, c.metrics, c.settings.request_timeout_s, x, named
        )
        return [float(o["logits" if raw else "probabilities"][0]) for o in outputs], tokens
    c.check_batch(len(firsts) + len(texts), x)
    rows = await retrieval.embedded(model, firsts, texts, truncate, c, x, labels)
    table = cosines(rows[0], rows[1])
    return [float(table[q, j]) for j, q in enumerate(query_of)], rows[2]


async def _ranked(
    model: ServedModel,
    query: tuple[str, str],
    documents: tuple[str, list[str]],
    truncate: bool | None,
    margin: float | None,
    budget_ms: float | None,
    c: Collaborators,
    x: Exchange,
) -> tuple[Ranked, int]:
    """The documents ranked against the query (service.ranking: by the model, or by a cross-encoder pair's
    ranking cascade), each by its raw score (a logit, a cosine), and the tokens the client's answer read."""
    tokens = 0

    async def score(by: ServedModel, indices: Sequence[int], exchange: Exchange) -> list[float]:
        nonlocal tokens
        found, read = await _scores(by, query, documents, truncate, c, exchange, raw=True, indices=indices)
        tokens += 0 if exchange.shadow else read
        return found

    ranked = await rank(c.pairs, model, len(documents[1]), score, margin, x, budget_ms)
    return ranked, tokens


def _shown(model: ServedModel, score: float, raw: bool) -> float:
    """A raw score as the client asked for it: a cross-encoder's logit as its sigmoid unless `raw`."""
    return score if raw or not model.manifest.cross_encoder else 1.0 / (1.0 + math.exp(-score))


async def handle_rerank(body: RerankRequest, x: Exchange, c: Collaborators) -> RerankResponse:
    texts = body.ranked()
    model = ranking_model(body.model, c, x)
    query = ("query", body.query)
    cascade = body.cascade_margin, body.cascade_budget_ms
    ranked, tokens = await _ranked(model, query, ("documents", texts), None, *cascade, c, x)
    results = [
        RerankResult(
            index=i, relevance_score=_shown(model, ranked.scores[i], False), model=ranked.scored_by[i]
        )
        for i in ranked.order[: body.top_n or len(texts)]
    ]
    if body.return_documents:
        for result in results:
            result["document"] = RerankDocument(text=texts[result["index"]])
    return RerankResponse(
        id=f"rerank-{uuid.uuid4().hex}",
        model=model.name,
        usage=RerankUsage(total_tokens=tokens),
        results=results,
    )


async def handle_either(
    body: EitherRerankRequest, x: Exchange, c: Collaborators
) -> RerankResponse | list[TeiRank]:
    """/rerank: TEI's answer to TEI's request (its `truncate` too), Jina's and Cohere's to theirs."""
    if body.texts is None:
        return await handle_rerank(body, x, c)
    texts = body.texts
    model = ranking_model(body.model, c, x)
    query, documents = ("query", body.query), ("texts", texts)
    cascade = body.cascade_margin, body.cascade_budget_ms
    ranked, _ = await _ranked(model, query, documents, body.truncate, *cascade, c, x)
    ranks = [
        TeiRank(index=i, score=_shown(model, ranked.scores[i], body.raw_scores), model=ranked.scored_by[i])
        for i in ranked.order[: body.top_n or len(texts)]
    ]
    if body.return_text:
        for rank in ranks:
            rank["text"] = texts[rank["index"]]
    return ranks


def paired(text_1: str | list[str], text_2: str | list[str]) -> bool:
    """vLLM's pairing: whether text_1[i] goes with text_2[i] (else text_1's one text with each text_2)."""
    firsts = 1 if isinstance(text_1, str) else len(text_1)
    seconds = 1 if isinstance(text_2, str) else len(text_2)
    if firsts == 1:
        return False
    if firsts != seconds:
        raise InvalidInputError(
            f"text_1 has {firsts} texts and text_2 {seconds}: send one text_1 to score against every "
            "text_2, or as many of each to score pair by pair",
            param="text_2",
        )
    return True


async def handle_score(body: ScoreRequest, x: Exchange, c: Collaborators) -> ScoreResponse:
    by_pair = paired(body.text_1, body.text_2)
    documents = [body.text_2] if isinstance(body.text_2, str) else body.text_2
    model = ranking_model(body.model, c, x)
    scores, tokens = await _scores(
        model, ("text_1", body.text_1), ("text_2", documents), None, c, x, by_pair=by_pair
    )
    return ScoreResponse(
        id=f"score-{uuid.uuid4().hex}",
        object="list",
        created=int(time.time()),
        model=model.name,
        data=[ScoreData(index=i, object="score", score=s) for i, s in enumerate(scores)],
        usage=ScoreUsage(prompt_tokens=tokens, total_tokens=tokens),
    )


async def handle_similarity(body: SimilarityRequest, x: Exchange, c: Collaborators) -> list[float]:
    """TEI's, for embedding models only (as TEI serves it)."""
    model = ranking_model(body.model, c, x, cross=False)
    query = ("inputs.source_sentence", body.inputs.source_sentence)
    scores, _ = await _scores(model, query, ("inputs.sentences", body.inputs.sentences), body.truncate, c, x)
    return scores


RERANK = (
    "Rank documents against a query, best first, by cosine or a cross-encoder (a student's unsure head read "
    "again by its teacher): Jina's and Cohere's rerank, as vLLM serves it"
)
TAGS = ("embeddings",)
ENDPOINTS = (
    *(
        Endpoint(path, RerankRequest, RerankResponse, f"{RERANK}.", handle_rerank, "openai", TAGS)
        for path in ("/v1/rerank", "/v2/rerank")
    ),
    Endpoint(
        "/rerank",
        EitherRerankRequest,
        RerankResponse | list[TeiRank],
        f"{RERANK}; with `texts` instead of `documents`, text-embeddings-inference's.",
        handle_either,
        tags=TAGS,
    ),
    *(
        Endpoint(
            path,
            ScoreRequest,
            ScoreResponse,
            "vLLM's score: each pair's cosine or cross-encoder relevance (one against many, or by pair).",
            handle_score,
            "openai",
            TAGS,
        )
        for path in ("/v1/score", "/score")
    ),
    Endpoint(
        "/similarity",
        SimilarityRequest,
        list[float],
        "text-embeddings-inference's /similarity: a sentence's cosine with each of several.",
        handle_similarity,
        tags=TAGS,
    ),
)
