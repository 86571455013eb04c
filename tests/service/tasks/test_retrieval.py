"""service.tasks.retrieval's documents: one another request is embedding right now is awaited, not embedded
twice; if that request fails, its waiters embed the document themselves; and the cache is read only where
the request cuts texts past the window (a cached vector may be of a cut text)."""

from __future__ import annotations

import asyncio
from types import SimpleNamespace
from typing import Any

import numpy as np
import pytest

from service.metrics import Metrics
from service.shadow import ShadowChecks
from service.tasks import embedding_shadow, retrieval
from service.tasks.retrieval import PassageCache

MODEL: Any = SimpleNamespace(
    name="m", manifest=SimpleNamespace(version=1, embedding=SimpleNamespace(output="vec"))
)
DOCUMENTS = ["the first document", "the second", "the first document"]


def vector(text: str) -> np.ndarray:
    return np.array([len(text), sum(map(ord, text)) % 97], dtype=np.float32)


class Engine:
    """run_texts as retrieval calls it: each call's texts recorded, each a while in flight; `failing`
    texts make their call fail."""

    def __init__(self, failing: frozenset[str] = frozenset()) -> None:
        self.calls: list[list[str]] = []
        self.failing = failing

    async def __call__(
        self, model: Any, texts: list[str], *args: Any
    ) -> tuple[list[dict[str, np.ndarray]], int]:
        self.calls.append(list(texts))
        await asyncio.sleep(0.05)
        if self.failing & set(texts):
            raise RuntimeError("the engine failed")
        return [{"vec": vector(t)} for t in texts], sum(len(t.split()) for t in texts)


class Unpaired:
    """service.cascade.Pairs where no model has a teacher."""

    def __init__(self, settings: Any) -> None:
        self.shadows = ShadowChecks(settings)

    def pair_of(self, model: Any) -> None:
        return None


def collaborators(capacity: int = 16) -> Any:
    settings = SimpleNamespace(request_timeout_s=5, shadow_rate=0.0, embedding_documents="own")
    return SimpleNamespace(
        passages=PassageCache(capacity, Metrics()), metrics=None, settings=settings, pairs=Unpaired(settings)
    )


def exchange(policy: str = "truncate") -> Any:
    return SimpleNamespace(limits=SimpleNamespace(truncation=policy), shadow=False, answered_by=())


def embed(c: Any, query: str, truncate: bool | None = None, policy: str = "truncate") -> Any:
    return retrieval.embedded(MODEL, [query], DOCUMENTS, truncate, c, exchange(policy))


def expected(query: str) -> tuple[np.ndarray, np.ndarray]:
    return vector(query)[None, :], np.stack([vector(d) for d in DOCUMENTS])


def test_a_document_in_flight_is_awaited_not_embedded_again(monkeypatch: pytest.MonkeyPatch) -> None:
    engine = Engine()
    monkeypatch.setattr(embedding_shadow, "run_texts", engine)
    c = collaborators()

    async def both() -> list[Any]:
        first = asyncio.create_task(embed(c, "one query"))
        await asyncio.sleep(0.01)  # the first request's documents are in flight
        return await asyncio.gather(first, embed(c, "another query"))

    (q1, d1, _), (q2, d2, tokens) = asyncio.run(both())
    assert engine.calls == [["one query", DOCUMENTS[0], DOCUMENTS[1]], ["another query"]]
    for (q, d), query in (((q1, d1), "one query"), ((q2, d2), "another query")):
        np.testing.assert_array_equal(q, expected(query)[0])
        np.testing.assert_array_equal(d, expected(query)[1])
    assert tokens == 2  # only its query was embedded for the second


def test_when_the_request_embedding_it_fails_its_waiters_embed_it_themselves(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    engine = Engine(failing=frozenset({"a failing query"}))
    monkeypatch.setattr(embedding_shadow, "run_texts", engine)
    c = collaborators()

    async def both() -> list[Any]:
        first = asyncio.create_task(embed(c, "a failing query"))
        await asyncio.sleep(0.01)
        return await asyncio.gather(first, embed(c, "a query"), return_exceptions=True)

    failed, (query, documents, _) = asyncio.run(both())
    np.testing.assert_array_equal(query, expected("a query")[0])
    assert isinstance(failed, RuntimeError)
    assert engine.calls[1:] == [["a query"], [DOCUMENTS[0], DOCUMENTS[1]]]
    np.testing.assert_array_equal(documents, expected("a query")[1])
    assert c.passages.in_flight(PassageCache.key(MODEL, DOCUMENTS[0])) is None


@pytest.mark.parametrize(("truncate", "policy"), [(False, "truncate"), (None, "reject")])
def test_a_request_that_refuses_long_texts_embeds_every_document(
    monkeypatch: pytest.MonkeyPatch, truncate: bool | None, policy: str
) -> None:
    engine = Engine()
    monkeypatch.setattr(embedding_shadow, "run_texts", engine)
    c = collaborators()
    asyncio.run(embed(c, "a query"))  # cached now
    asyncio.run(embed(c, "a query", truncate, policy))
    assert engine.calls[1] == ["a query", DOCUMENTS[0], DOCUMENTS[1]]
    asyncio.run(embed(c, "a query", True, policy))  # told to cut: the cache again
    assert engine.calls[2] == ["a query"]


def test_no_cache_claims_nothing_and_keeps_nothing(monkeypatch: pytest.MonkeyPatch) -> None:
    engine = Engine()
    monkeypatch.setattr(embedding_shadow, "run_texts", engine)
    c = collaborators(capacity=0)

    async def both() -> list[Any]:
        return await asyncio.gather(embed(c, "one query"), embed(c, "another query"))

    asyncio.run(both())
    assert sorted(map(len, engine.calls)) == [3, 3] and len(c.passages) == 0
