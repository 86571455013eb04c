"""Retrieval for retrieve-then-read QA and for rerank and score (service.tasks.similarity): embed a query
and its passages, rank the passages by cosine.

Clients send the same passages again and again (their documents, a question at a time), so each passage's
embedding is kept in a bounded least-recently-used cache keyed by the sha256 of the model's name, its
version and the text: a repeated passage costs a hash and a lookup, not an engine call. The cache lives in
each frontend process (`DISTILSERVE_PASSAGE_CACHE` entries, 0: none); hits and misses are counted per
embedding model. The question itself is never cached (it changes with every request) and is embedded in
the same engine request as the passages that missed. A passage another request is embedding right now is
awaited, not embedded again (clients that send one document set with many queries at once would otherwise
each embed all of it); should that request fail, the ones waiting embed it themselves. Texts are looked up
only where the request would cut a text past the window (the server's policy, or `truncate: true`): a
cached vector may be of a cut text, and a request that refuses those must see each text.

An embedding student served with its teacher may have the teacher embed its documents
(DISTILSERVE_EMBEDDING_DOCUMENTS=teacher, `documents_model`): its vectors were distilled into the teacher's
space, so its query against the teacher's documents ranks closer to the teacher than against its own (SQuAD
part A: recall@1 0.627 against 0.589, the teacher 0.659), and once the documents are cached a query costs
the student's embedding alone.
"""

from __future__ import annotations

import asyncio
import hashlib
from collections import OrderedDict
from collections.abc import Sequence
from typing import TYPE_CHECKING

import numpy as np

from service.exchange import Exchange
from service.tasks.contract import Collaborators, InvalidInputError
from service.tasks.embedding_shadow import embedded_rows
from service.tasks.vectors import EMBEDDINGS, cosines

if TYPE_CHECKING:
    from service.metrics import Metrics
    from service.served import ServedModel


class PassageCache:
    """Passage embeddings by content hash, at most `capacity` of them, the least recently used dropped
    first. Used from one event loop only, so it needs no lock."""

    def __init__(self, capacity: int, metrics: Metrics) -> None:
        self.capacity = capacity
        self._metrics = metrics
        self._vectors: OrderedDict[bytes, np.ndarray] = OrderedDict()
        self._embedding: dict[bytes, asyncio.Future[np.ndarray | None]] = {}  # in flight, by another request

    def __len__(self) -> int:
        return len(self._vectors)

    @staticmethod
    def key(model: ServedModel, text: str) -> bytes:
        """sha256 of the model's name and version and the text: another model (or version) embeds the
        same text elsewhere. `surrogatepass`: JSON may carry a lone surrogate, which plain UTF-8 refuses."""
        digest = hashlib.sha256(f"{model.name}\0{model.manifest.version}\0".encode())
        digest.update(text.encode("utf-8", "surrogatepass"))
        return digest.digest()

    def get(self, key: bytes) -> np.ndarray | None:
        vector = self._vectors.get(key)
        if vector is not None:
            self._vectors.move_to_end(key)
        return vector

    def put(self, key: bytes, vector: np.ndarray) -> None:
        if self.capacity == 0:
            return
        self._vectors[key] = vector
        self._vectors.move_to_end(key)
        while len(self._vectors) > self.capacity:
            self._vectors.popitem(last=False)

    def in_flight(self, key: bytes) -> asyncio.Future[np.ndarray | None] | None:
        """The vector another request is embedding now (None when it fails: embed it yourself)."""
        return self._embedding.get(key)

    def claim(self, keys: Sequence[bytes]) -> None:
        """This request embeds these: others asking meanwhile wait for it."""
        if self.capacity == 0:
            return
        loop = asyncio.get_running_loop()
        for key in keys:
            self._embedding[key] = loop.create_future()

    def settle(self, key: bytes, vector: np.ndarray | None) -> None:
        """A claimed text's vector (kept), or None when its request failed; whoever waits gets it."""
        waiting = self._embedding.pop(key, None)
        if waiting is not None and not waiting.done():
            waiting.set_result(vector)
        if vector is not None:
            self.put(key, vector)

    def count(self, model: ServedModel, hits: int, misses: int) -> None:
        self._metrics.passage_cache_hits.labels(model.name).inc(hits)
        self._metrics.passage_cache_misses.labels(model.name).inc(misses)


def embedding_model(name: str | None, c: Collaborators) -> ServedModel:
    """The model that embeds: the one named, else the first served sentence-embeddings model. It is not
    the request's model (the reader is), so the exchange is not told of it."""
    if name is None and not any(m.manifest.task == EMBEDDINGS for m in c.registry.all()):
        raise InvalidInputError(
            "passages: ranking them needs a sentence-embeddings model and this server serves none; "
            "send one context instead",
            param="passages",
        )
    return c.registry.resolve(EMBEDDINGS, name, None)  # an unknown name: 404; another task's: 422


def top_by_cosine(question: np.ndarray, passages: np.ndarray, k: int) -> list[int]:
    """The indices of the `k` passages most similar to the question, best first (ties: the earlier)."""
    scores = cosines(question[None, :], passages)[0]
    return [int(i) for i in np.argsort(-scores, kind="stable")[:k]]


def documents_model(model: ServedModel, c: Collaborators) -> ServedModel:
    """Who embeds the documents `model` ranks: its teacher where `model` is an embedding student served
    with it and DISTILSERVE_EMBEDDING_DOCUMENTS is `teacher`, else `model` itself."""
    pair = c.pairs.pair_of(model) if c.settings.embedding_documents == "teacher" else None
    return model if pair is None else pair.teacher


async def embedded(
    model: ServedModel,
    queries: Sequence[str],
    documents: Sequence[str],
    truncate: bool | None,
    c: Collaborators,
    x: Exchange,
    labels: tuple[Sequence[str], Sequence[str]] | None = None,
    documents_by: ServedModel | None = None,
) -> tuple[np.ndarray, np.ndarray, int]:
    """The rows of `queries` (embedded afresh) and of `documents` (from the passage cache where held, or
    from the request embedding them now), in one engine request for all the rest; and the tokens embedded.
    A text repeated among the documents is embedded once. `labels`: what a message calls each query and
    each document (the request's fields). Where `documents_model` names another model (a student's
    teacher), the queries are `model`'s and the documents that model's, the two embedded at once
    (`documents_by`: who embeds the documents, when the caller has decided)."""
    other = documents_model(model, c) if documents_by is None else documents_by
    if other is not model:
        named = (None, None) if labels is None else ((labels[0], ()), ((), labels[1]))
        (asked, _, read), (_, theirs, more) = await asyncio.gather(
            embedded(model, queries, (), truncate, c, x, named[0], model),
            embedded(other, (), documents, truncate, c, x, named[1], other),
        )
        x.answered_by = (model.name, other.name)
        return asked, theirs, read + more
    cache = c.passages
    cached = truncate is True or (truncate is None and x.limits.truncation == "truncate")
    keys = [cache.key(model, text) for text in documents]
    vectors: dict[bytes, np.ndarray] = {}
    waiting: dict[bytes, asyncio.Future[np.ndarray | None]] = {}
    mine: dict[bytes, int] = {}  # key -> the first document holding the text, embedded here
    for j, key in enumerate(keys):
        if key in vectors or key in waiting or key in mine:
            continue
        found = cache.get(key) if cached else None
        in_flight = cache.in_flight(key) if cached else None
        if found is not None:
            vectors[key] = found
        elif in_flight is not None:
            waiting[key] = in_flight
        else:
            mine[key] = j
    cache.count(model, len(keys) - len(mine), len(mine))
    if cached:
        cache.claim(list(mine))
    try:
        rows, tokens = await _embed(model, queries, documents, list(mine.values()), truncate, c, x, labels)
    except BaseException:
        for key in mine if cached else ():
            cache.settle(key, None)
        raise
    for key, row in zip(mine, rows[len(queries) :], strict=True):
        vectors[key] = row
        if cached:
            cache.settle(key, row)
    failed = []
    for key, future in waiting.items():
        vector = await future
        if vector is None:
            failed.append(keys.index(key))
        else:
            vectors[key] = vector
    if failed:  # the request that was embedding them failed: this one embeds them (rare)
        again, more = await _embed(model, [], documents, failed, truncate, c, x, labels)
        tokens += more
        vectors.update((keys[j], row) for j, row in zip(failed, again, strict=True))
    found = np.stack([vectors[key] for key in keys]) if keys else np.zeros((0, 0), np.float32)
    return rows[: len(queries)], found, tokens


async def _embed(
    model: ServedModel,
    queries: Sequence[str],
    documents: Sequence[str],
    which: list[int],
    truncate: bool | None,
    c: Collaborators,
    x: Exchange,
    labels: tuple[Sequence[str], Sequence[str]] | None,
) -> tuple[np.ndarray, int]:
    """The queries' rows and those of documents[which], in one engine request."""
    texts = [*queries, *(documents[j] for j in which)]
    named = None if labels is None else [*labels[0], *(labels[1][j] for j in which)]
    if not texts:
        return np.zeros((0, 0), np.float32), 0
    _, rows, tokens = await embedded_rows(model, texts, truncate, c, x, named)
    return rows, tokens


async def retrieve(
    model: ServedModel, question: str, passages: Sequence[str], k: int, c: Collaborators, x: Exchange
) -> list[int]:
    """The indices of the `k` passages nearest the question under `model`, best first. Passages past the
    embedding model's window are ranked by their first window (the reader still reads all of them)."""
    questions, rows, _ = await embedded(model, [question], passages, True, c, x)
    return top_by_cosine(questions[0], rows, k)
