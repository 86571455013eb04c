"""Retrieve, then read: `/v1/qa` with `passages` ranks them by the served embedding model's cosine, reads the
nearest with the QA model (a student's unsure ones with its teacher) and answers with a span of a passage.

The models are untrained tiny ones, so "right" is checked against the service's own parts: the passages read
are exactly the top-k by a numpy cosine over the vectors /v1/embeddings returns, and the answer is the best of
what /v1/qa gives for each of those passages as a single context.
"""

from __future__ import annotations

import shutil
from collections.abc import Awaitable, Iterator, Sequence
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import numpy as np
import pytest
from fastapi.testclient import TestClient

from service.app import create_app
from service.metrics import Metrics
from service.settings import Settings
from service.tasks import question_answering
from service.tasks.retrieval import PassageCache, top_by_cosine
from tests.conftest import write_eval_data
from tests.export.test_embeddings_export import build_sentence_model, write_sentences
from tests.service.test_app import metric_value

EMBED, QA, TEACHER = "embed", "qa", "qa-teacher"
QUESTION = "Who founded Acme?"
PASSAGES = [
    "I loved this film, it was wonderful.",
    "Who founded Acme? Acme was founded by John Smith in 1950.",
    "A dull, terrible film. I hated every minute of it.",
    "Where is Springfield? Springfield is a city.",
    "When was it founded? It was founded in 1950.",
    "I hated every minute of this dull film.",
]


@pytest.fixture(scope="module")
def repositories(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """`full`: a tiny sentence-embeddings model beside a tiny QA student paired with its teacher;
    `no-embeddings`: the QA pair alone."""
    from export.pipeline import PairSpec, export_model
    from service.manifest import TeacherRef
    from tests.tiny_models import build_tiny

    root = tmp_path_factory.mktemp("retrieve-read")
    full = root / "models"
    qa_eval = write_eval_data("question-answering", root)
    teacher_dir = build_tiny("question-answering", root / TEACHER, seed=0)
    teacher = export_model(teacher_dir, "question-answering", TEACHER, full, ("fp32",), eval_data=qa_eval)
    assert teacher.version_dir is not None
    pair = PairSpec(TeacherRef(name=TEACHER, version=1), teacher_dir, 0.99)
    student_dir = build_tiny("question-answering", root / QA, seed=1)
    student = export_model(
        student_dir, "question-answering", QA, full, ("fp32",), eval_data=qa_eval, pair=pair
    )
    assert student.version_dir is not None
    embed_dir = build_sentence_model(root / EMBED, seed=1)  # seeds 1-6 rank the passage first by >= 0.004
    sentences = write_sentences(root / "sentences.txt")
    embedder = export_model(embed_dir, "sentence-embeddings", EMBED, full, ("fp32",), eval_data=sentences)
    assert embedder.version_dir is not None, [(r.variant, r.problems) for r in embedder.variants]

    alone = root / "no-embeddings"
    for name in (QA, TEACHER):
        shutil.copytree(full / name, alone / name)
    return {"full": full, "no-embeddings": alone}


@pytest.fixture(scope="module")
def client(repositories: dict[str, Path]) -> Iterator[TestClient]:
    with TestClient(create_app(Settings(model_repository=repositories["full"], max_client_batch=8))) as c:
        yield c


Read = list[tuple[str, list[str]]]


@pytest.fixture
def reads(monkeypatch: pytest.MonkeyPatch) -> Read:
    """What the QA models read: (model, its contexts) per call of answer_all."""
    seen: Read = []
    original = question_answering.answer_all

    def spy(
        model: Any, pairs: Sequence[tuple[str, str]], *args: Any
    ) -> Awaitable[list[list[question_answering.Answer]]]:
        seen.append((model.name, [context for _, context in pairs]))
        return original(model, pairs, *args)

    monkeypatch.setattr(question_answering, "answer_all", spy)
    return seen


def ask(client: TestClient, **body: Any) -> Any:
    r = client.post("/v1/qa", json={"question": QUESTION, "passages": PASSAGES, **body})
    assert r.status_code == 200, r.text
    return r.json()


def served_embeddings(client: TestClient, texts: list[str]) -> np.ndarray:
    r = client.post("/v1/embeddings", json={"input": texts, "model": EMBED})
    assert r.status_code == 200, r.text
    return np.array([d["embedding"] for d in r.json()["data"]])


def numpy_top(client: TestClient, question: str, passages: list[str], k: int) -> list[int]:
    """The reference ranking: cosine over the vectors the service itself serves, in plain numpy."""
    vectors = served_embeddings(client, [question, *passages])
    unit = vectors / np.linalg.norm(vectors, axis=1, keepdims=True)
    scores = unit[1:] @ unit[0]
    assert np.diff(np.sort(scores)).min() > 1e-4  # no near ties: the order is the model's, not noise
    return [int(i) for i in np.argsort(-scores)[:k]]


def single_context(client: TestClient, context: str, **body: Any) -> Any:
    r = client.post("/v1/qa", json={"question": QUESTION, "context": context, **body})
    assert r.status_code == 200, r.text
    return r.json()


# -- retrieval ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize("k", [1, 3, len(PASSAGES)])
def test_the_passages_read_are_exactly_the_top_k_by_cosine(client: TestClient, reads: Read, k: int) -> None:
    expected = numpy_top(client, QUESTION, PASSAGES, k)
    answer = ask(client, top_k_passages=k, cascade_threshold=0.0)
    assert reads == [(QA, [PASSAGES[i] for i in expected])]  # nearest first, one engine request
    assert answer["passage"] in expected and answer["model"] == QA
    assert PASSAGES[answer["passage"]][answer["start"] : answer["end"]] == answer["answer"] != ""

    # the best of the passages read, each as /v1/qa answers it as a single context
    singles = {i: single_context(client, PASSAGES[i], cascade_threshold=0.0) for i in expected}
    best = max(expected, key=lambda i: singles[i]["score"])
    assert answer == {**singles[best], "passage": best}


def test_the_default_reads_three(client: TestClient, reads: Read) -> None:
    ask(client, cascade_threshold=0.0)
    assert [len(contexts) for _, contexts in reads] == [question_answering.TOP_K_PASSAGES]


def test_the_passage_that_holds_the_answer_is_retrieved(client: TestClient) -> None:
    """A constructed case: only one passage holds the question's words and the answer beside them."""
    assert numpy_top(client, QUESTION, PASSAGES, 1) == [1]
    answer = ask(client, top_k_passages=1)
    assert answer["passage"] == 1
    assert PASSAGES[1][answer["start"] : answer["end"]] == answer["answer"]


def test_top_k_answers_come_from_all_passages_read_best_first(client: TestClient) -> None:
    expected = numpy_top(client, QUESTION, PASSAGES, 3)
    answers = ask(client, top_k=5, top_k_passages=3, cascade_threshold=0.0)
    assert len(answers) == 5 and {a["passage"] for a in answers} <= set(expected)
    assert [a["score"] for a in answers] == sorted((a["score"] for a in answers), reverse=True)
    for a in answers:
        assert PASSAGES[a["passage"]][a["start"] : a["end"]] == a["answer"]
    pooled = [
        {**a, "passage": i}
        for i in expected
        for a in single_context(client, PASSAGES[i], top_k=5, cascade_threshold=0.0)
    ]
    assert answers == sorted(pooled, key=lambda a: -a["score"])[:5]


def test_the_reader_falls_back_to_its_teacher(client: TestClient, reads: Read) -> None:
    r = client.post(
        "/v1/qa",
        json={"question": QUESTION, "passages": PASSAGES, "top_k_passages": 2, "cascade_threshold": 1.0},
    )
    assert r.status_code == 200, r.text
    assert r.headers["x-distilserve-answered-by"] == TEACHER and r.json()["model"] == TEACHER
    read = [PASSAGES[i] for i in numpy_top(client, QUESTION, PASSAGES, 2)]
    assert reads == [(QA, read), (TEACHER, read)]  # the student first, then its teacher for the unsure


# -- the passage cache ---------------------------------------------------------------------------------------


def cache_counts(client: TestClient) -> tuple[float, float]:
    text = client.get("/metrics").text
    return (
        metric_value(text, "distilserve_passage_cache_hits_total", model=EMBED),
        metric_value(text, "distilserve_passage_cache_misses_total", model=EMBED),
    )


def test_a_repeated_passage_hits_the_cache(client: TestClient) -> None:
    fresh = [f"Springfield had {n} films about Acme." for n in range(3)]  # in no other test
    hits, misses = cache_counts(client)
    first = client.post("/v1/qa", json={"question": QUESTION, "passages": [*fresh, fresh[0]]}).json()
    assert cache_counts(client) == (hits + 1, misses + 3)  # the repeat within the request is embedded once
    again = client.post("/v1/qa", json={"question": QUESTION, "passages": fresh}).json()
    assert cache_counts(client) == (hits + 4, misses + 3)
    for answer, passages in ((first, [*fresh, fresh[0]]), (again, fresh)):
        assert passages[answer["passage"]][answer["start"] : answer["end"]] == answer["answer"]


def test_the_cache_keeps_the_most_recently_used() -> None:
    metrics = Metrics()
    cache = PassageCache(2, metrics)
    model = SimpleNamespace(name="m", manifest=SimpleNamespace(version=1))
    keys = [PassageCache.key(model, t) for t in ("a", "b", "c")]  # type: ignore[arg-type]
    for i, key in enumerate(keys[:2]):
        cache.put(key, np.full(2, i))
    assert cache.get(keys[0]) is not None  # used: b is now the oldest
    cache.put(keys[2], np.zeros(2))
    assert len(cache) == 2 and cache.get(keys[1]) is None and cache.get(keys[0]) is not None

    other = SimpleNamespace(name="m", manifest=SimpleNamespace(version=2))
    assert PassageCache.key(other, "a") != keys[0]  # type: ignore[arg-type]
    assert PassageCache.key(model, "\ud800") != keys[0]  # type: ignore[arg-type]  # a lone surrogate hashes

    none = PassageCache(0, metrics)
    none.put(keys[0], np.zeros(2))
    assert len(none) == 0 and none.get(keys[0]) is None


def test_top_by_cosine_ignores_length_and_keeps_ties_in_order() -> None:
    passages = np.array([[0.0, 1.0], [10.0, 0.0], [1.0, 1.0], [3.0, 0.0]])
    assert top_by_cosine(np.array([2.0, 0.0]), passages, 3) == [1, 3, 2]


# -- bad input ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("body", "status", "message"),
    [
        ({"passages": ["x"]}, 422, "passages need a question"),
        (
            {"question": QUESTION, "passages": ["x"], "context": "x"},
            422,
            "give a context or passages, not both",
        ),
        (
            {"passages": ["x"], "inputs": [{"question": QUESTION, "context": "x"}]},
            422,
            "give question + passages, or inputs, not both",
        ),
        ({"question": QUESTION, "passages": []}, 422, "the list of passages is empty"),
        ({"question": QUESTION, "passages": ["x", " \n"]}, 422, "passage 1 is an empty text"),
        ({"question": QUESTION, "passages": "one text"}, 422, "passages"),
        ({"question": QUESTION, "passages": ["x", 3]}, 422, "passages.1"),
        ({"question": QUESTION, "passages": ["film"] * 9}, 422, "passages: 9 texts, at most 8"),
        ({"question": QUESTION, "passages": ["x"], "top_k_passages": 0}, 422, "top_k_passages"),
        ({"question": QUESTION, "context": "x", "top_k_passages": 2}, 422, "go with passages"),
        ({"question": QUESTION, "context": "x", "embedding_model": EMBED}, 422, "go with passages"),
        ({"question": QUESTION, "passages": ["x"], "embedding_model": "nope"}, 404, "nope"),
        ({"question": QUESTION, "passages": ["x"], "embedding_model": QA}, 422, "not sentence-embeddings"),
        ({"question": QUESTION, "passages": ["x", "y" * 100_001]}, 422, "passage 1 is 100001 characters"),
        ({"question": QUESTION, "passages": ["\u200b\u200b"]}, 422, "no text the model can read"),
        ({"question": "Who? " * 200, "passages": ["x"]}, 422, "the question is too long"),
    ],
)
def test_bad_input_is_a_4xx(client: TestClient, body: dict[str, Any], status: int, message: str) -> None:
    r = client.post("/v1/qa", json=body)
    assert r.status_code == status, r.text
    assert message in r.json()["error"]


def test_no_embedding_model_served_is_a_clear_422(repositories: dict[str, Path]) -> None:
    with TestClient(create_app(Settings(model_repository=repositories["no-embeddings"]))) as c:
        r = c.post("/v1/qa", json={"question": QUESTION, "passages": PASSAGES})
        assert r.status_code == 422, r.text
        assert "needs a sentence-embeddings model and this server serves none" in r.json()["error"]
        assert c.post("/v1/qa", json={"question": QUESTION, "context": PASSAGES[1]}).status_code == 200


def test_the_other_forms_are_unchanged(client: TestClient) -> None:
    one = single_context(client, PASSAGES[1], cascade_threshold=0.0)
    assert set(one) == {"answer", "score", "start", "end", "model"}
    r = client.post("/v1/qa", json={"inputs": [{"question": QUESTION, "context": PASSAGES[1]}] * 2})
    assert r.status_code == 200 and all("passage" not in a for a in r.json())
    schema = client.get("/openapi.json").json()["components"]["schemas"]
    assert {"passages", "top_k_passages", "embedding_model"} <= set(schema["QARequest"]["properties"])
    assert "passage" in schema["PassageAnswer"]["properties"]
