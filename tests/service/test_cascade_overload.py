"""A cascade whose teacher cannot answer: the student's answers stand, counted and said, instead of a 429,
a 503 or a 504 for inputs the student has already answered (DISTILSERVE_CASCADE_OVERLOAD=refuse: as before).

The pair repository's untrained tiny models (conftest's `pair_repository`); the teacher's engine is held
(`HeldTeacher`) so a test knows what it is computing and what waits in its queue, without timing.
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest

from service.engine import Engine
from service.repository import ModelVersion
from service.runtime import ort_engine_factory
from service.settings import Settings
from tests.service.test_app import metric_value, run_with_client
from tests.service.test_cascade import with_calibration

TEXT = "I loved this film, it was wonderful."
TEACHER = "cls-teacher"


class HeldTeacher:
    """An engine factory whose `teacher` engine calls wait until `release()` once `hold()` was called (after
    warm-up), counting each one."""

    def __init__(self, teacher: str = TEACHER) -> None:
        self.teacher = teacher
        self.calls = 0
        self.started = threading.Event()
        self._released = threading.Event()

    def release(self) -> None:
        self._released.set()

    def __call__(self, version: ModelVersion, variant: str, settings: Settings) -> Engine:
        inner = ort_engine_factory(version, variant, settings)
        if version.name != self.teacher:
            return inner
        held = self

        class Held:
            provider, input_names = inner.provider, inner.input_names

            def run(self, feeds: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
                if held.started.is_set():  # warm-up has run: from here on, every call waits
                    held.calls += 1
                    held._released.wait(60)  # a test that forgot to release does not hang the run
                return inner.run(feeds)

        return Held()  # type: ignore[return-value]

    def hold(self) -> None:
        self.started.set()


def settings_for(repository: Path, **fields: Any) -> Settings:
    """One engine thread a model, a teacher queue of two: a call held, and two behind it, fill it."""
    chosen: dict[str, Any] = {"max_wait_ms": 0, "instances": 1, "max_queue": 2} | fields
    return Settings(model_repository=repository, **chosen)


async def classify(
    client: httpx.AsyncClient, threshold: float | None = 1.0, model: str = "cls", **fields: Any
) -> Any:
    body: dict[str, Any] = {"inputs": [TEXT], "model": model, "top_k": 2, **fields}
    if threshold is not None:
        body["cascade_threshold"] = threshold
    return await client.post("/v1/classify", json=body)


async def until(check: Callable[[], Any], seconds: float = 20.0) -> None:
    deadline = time.monotonic() + seconds
    while not await check():
        assert time.monotonic() < deadline, "the service never got there"
        await asyncio.sleep(0.01)


async def teacher_full(client: httpx.AsyncClient, held: HeldTeacher) -> list[asyncio.Task[Any]]:
    """Three unsure requests: the teacher computes the first (held) and queues two, its whole queue."""
    first = asyncio.create_task(classify(client))
    await until(lambda: _true(held.calls == 1))
    behind = [asyncio.create_task(classify(client)) for _ in range(2)]

    async def queued() -> bool:
        text = (await client.get("/metrics")).text
        return metric_value(text, "distilserve_queue_depth", model=TEACHER) == 2

    await until(queued)
    return [first, *behind]


async def _true(value: bool) -> bool:
    return value


def kept(metrics: str, reason: str, model: str = "cls") -> float:
    return metric_value(
        metrics, "distilserve_cascade_kept_total", model=model, teacher=TEACHER, reason=reason
    )


def test_a_full_teacher_queue_leaves_the_students_answer_standing(pair_repository: Path) -> None:
    held = HeldTeacher()

    async def body(client: httpx.AsyncClient) -> None:
        student = (await classify(client, threshold=0.0)).json()[0]
        held.hold()
        waiting = await teacher_full(client, held)

        r = await classify(client)  # unsure, and the teacher has no room: the student's answer stands
        assert r.status_code == 200, r.text
        assert r.json()[0] == student and {e["model"] for e in r.json()[0]} == {"cls"}
        assert r.headers["x-distilserve-answered-by"] == "cls"
        assert r.headers["x-distilserve-teacher-busy"] == "1"
        alone = await classify(client, threshold=None, model=TEACHER)  # the teacher alone still refuses
        assert alone.status_code == 429
        metrics = (await client.get("/metrics")).text
        assert kept(metrics, "overloaded") == 1 and kept(metrics, "late") == 0
        assert metric_value(metrics, "distilserve_cascade_fallbacks_total", model="cls") == 0

        held.release()  # the three the teacher had taken are its own answers, none lost
        for done in await asyncio.gather(*waiting):
            assert done.status_code == 200 and done.json()[0][0]["model"] == TEACHER
            assert "x-distilserve-teacher-busy" not in done.headers
        metrics = (await client.get("/metrics")).text
        assert metric_value(metrics, "distilserve_cascade_fallbacks_total", model="cls") == 3

    run_with_client(settings_for(pair_repository), body, held)


def test_refuse_fails_the_request_as_the_teacher_alone_would(pair_repository: Path) -> None:
    held = HeldTeacher()

    async def body(client: httpx.AsyncClient) -> None:
        held.hold()
        waiting = await teacher_full(client, held)
        r = await classify(client)
        assert r.status_code == 429 and "retry-after" in r.headers
        assert kept((await client.get("/metrics")).text, "overloaded") == 0
        held.release()
        assert all(done.status_code == 200 for done in await asyncio.gather(*waiting))

    run_with_client(settings_for(pair_repository, cascade_overload="refuse"), body, held)


def test_past_the_budget_the_student_answers_and_the_teacher_computes_nothing_for_nobody(
    pair_repository: Path,
) -> None:
    held = HeldTeacher()

    async def body(client: httpx.AsyncClient) -> None:
        card = next(m for m in (await client.get("/v1/models")).json()["models"] if m["name"] == "cls")
        assert card["cascade"]["budget_ms"] == 300  # what /v1/models says the pair does when loaded
        student = (await classify(client, threshold=0.0)).json()[0]
        held.hold()
        computing = asyncio.create_task(classify(client))  # its teacher row starts in time: waited for
        await until(lambda: _true(held.calls == 1))
        started = time.monotonic()
        late = await classify(client)  # queued behind it past the budget: dropped before compute
        assert time.monotonic() - started < 10  # the budget ended the wait, not the held engine (60 s)
        assert late.status_code == 200 and late.json()[0] == student, late.text
        assert late.headers["x-distilserve-teacher-busy"] == "1"
        metrics = (await client.get("/metrics")).text
        assert kept(metrics, "late") == 1
        assert metric_value(metrics, "distilserve_queue_depth", model=TEACHER) == 0  # it left the queue
        held.release()
        first = await computing
        assert first.status_code == 200 and first.json()[0][0]["model"] == TEACHER
        assert "x-distilserve-teacher-busy" not in first.headers
        assert held.calls == 1  # the late one was never computed

    run_with_client(settings_for(pair_repository, cascade_budget_ms=300, max_queue=8), body, held)


def test_a_request_brings_its_own_budget_on_every_protocol(pair_repository: Path) -> None:
    held = HeldTeacher()

    async def body(client: httpx.AsyncClient) -> None:
        held.hold()
        computing = asyncio.create_task(classify(client))  # no budget of its own or the server's: waits
        await until(lambda: _true(held.calls == 1))
        own = await classify(client, cascade_budget_ms=200)  # queued behind it: its own budget ends it
        assert own.status_code == 200 and own.headers["x-distilserve-teacher-busy"] == "1"
        v2 = await client.post(
            "/v2/models/cls/infer",
            json={
                "inputs": [{"name": "TEXT", "datatype": "BYTES", "shape": [1], "data": [TEXT]}],
                "parameters": {"cascade_threshold": 1.0, "cascade_budget_ms": 200},
            },
        )
        assert v2.status_code == 200 and v2.headers["x-distilserve-teacher-busy"] == "1"
        tei = await client.post(
            "/predict",
            json={"inputs": TEXT, "model": "cls", "cascade_threshold": 1.0, "cascade_budget_ms": 200},
        )
        assert tei.status_code == 200 and tei.headers["x-distilserve-teacher-busy"] == "1"
        bad = await classify(client, cascade_budget_ms=0)
        assert bad.status_code == 422 and "cascade_budget_ms" in bad.text
        held.release()
        assert (await computing).json()[0][0]["model"] == TEACHER
        assert kept((await client.get("/metrics")).text, "late") == 3

    run_with_client(settings_for(pair_repository, max_queue=8), body, held)


def test_a_budget_spent_waiting_for_the_student_skips_the_teacher(pair_repository: Path) -> None:
    held = HeldTeacher("cls")  # the student this time: its queue is where a loaded cascade waits

    async def body(client: httpx.AsyncClient) -> None:
        def teacher_rows(text: str) -> float:
            return metric_value(text, "distilserve_batch_size_sum", model=TEACHER)

        before = teacher_rows((await client.get("/metrics")).text)
        held.hold()
        waiting = asyncio.create_task(classify(client))
        await until(lambda: _true(held.calls == 1))
        await asyncio.sleep(0.4)  # past the budget, still with the student
        held.release()
        r = await waiting
        assert r.status_code == 200 and r.json()[0][0]["model"] == "cls"
        assert r.headers["x-distilserve-teacher-busy"] == "1"
        text = (await client.get("/metrics")).text
        assert kept(text, "late") == 1 and teacher_rows(text) == before  # the teacher computed nothing

    run_with_client(settings_for(pair_repository, cascade_budget_ms=300), body, held)


def test_a_request_deadline_spent_on_the_teacher_keeps_the_students_answer(pair_repository: Path) -> None:
    held = HeldTeacher()

    async def body(client: httpx.AsyncClient) -> None:
        held.hold()
        waiting = asyncio.create_task(classify(client))
        await until(lambda: _true(held.calls == 1))
        r = await classify(client)  # queued behind the held call until its deadline: 504 before, now 200
        assert r.status_code == 200 and r.headers["x-distilserve-teacher-busy"] == "1"
        assert kept((await client.get("/metrics")).text, "late") == 1
        held.release()
        assert (await waiting).status_code == 200

    run_with_client(settings_for(pair_repository, request_timeout_s=0.5), body, held)


@pytest.fixture
def teacher_directly(pair_repository: Path, tmp_path: Path) -> Path:
    """The pairs, the classifier's calibrated as costing more than its teacher: the teacher answers all."""
    return with_calibration(pair_repository, tmp_path, student_cost=0.5)


def test_a_teacher_that_answers_directly_hands_over_to_the_student_when_full(teacher_directly: Path) -> None:
    held = HeldTeacher()

    async def body(client: httpx.AsyncClient) -> None:
        card = next(m for m in (await client.get("/v1/models")).json()["models"] if m["name"] == "cls")
        assert card["cascade"]["teacher_directly"] is True
        assert card["cascade"]["when_teacher_busy"] == "student" and card["cascade"]["budget_ms"] is None
        student = (await classify(client, threshold=0.0)).json()[0]
        held.hold()
        waiting = await teacher_full(client, held)
        r = await classify(client, threshold=None)
        assert r.status_code == 200 and r.json()[0] == student
        assert r.headers["x-distilserve-answered-by"] == "cls"
        assert r.headers["x-distilserve-teacher-busy"] == "1"
        assert kept((await client.get("/metrics")).text, "overloaded") == 1
        held.release()
        assert all(done.status_code == 200 for done in await asyncio.gather(*waiting))

    run_with_client(settings_for(teacher_directly), body, held)


@pytest.mark.parametrize("whose", ["server", "request"])
def test_a_ranking_cascade_past_its_budget_keeps_the_students_order(
    whose: str, ranking_pair: dict[str, Path]
) -> None:
    """The server's budget, or one the request brings (Cohere's /v1/rerank and TEI's /rerank alike)."""
    held = HeldTeacher("ranker-teacher")
    documents = ["Acme was founded by John Smith.", "Springfield is a city.", "It rained all day."]
    own = {"cascade_budget_ms": 200} if whose == "request" else {}
    cohere = {"model": "ranker", "query": "Who founded Acme?", "documents": documents} | own
    tei = {"model": "ranker", "query": "Who founded Acme?", "texts": documents} | own

    async def body_of(client: httpx.AsyncClient) -> None:
        alone = (await client.post("/v1/rerank", json=cohere | {"cascade_margin": 0.0})).json()["results"]
        held.hold()
        # every document to the teacher
        r = await client.post("/v1/rerank", json=cohere | {"cascade_margin": 100.0})
        assert r.status_code == 200, r.text
        assert r.json()["results"] == alone and {d["model"] for d in r.json()["results"]} == {"ranker"}
        assert r.headers["x-distilserve-answered-by"] == "ranker"
        assert r.headers["x-distilserve-teacher-busy"] == str(len(documents))
        r = await client.post("/rerank", json=tei | {"cascade_margin": 100.0})
        assert r.status_code == 200, r.text
        assert [d["index"] for d in r.json()] == [d["index"] for d in alone]
        assert r.headers["x-distilserve-teacher-busy"] == str(len(documents))
        text = (await client.get("/metrics")).text
        late = metric_value(text, "distilserve_cascade_kept_total", model="ranker", reason="late")
        assert late == 2 * len(documents)
        held.release()

    budget = 200 if whose == "server" else None
    settings = Settings(
        model_repository=ranking_pair["repository"],
        max_wait_ms=0,
        cascade_budget_ms=budget,
        request_timeout_s=120,  # past the held teacher's 60 s: only a budget ends these requests early
    )
    run_with_client(settings, body_of, held)


def test_a_teacher_that_answers_directly_past_the_budget_hands_over_to_the_student(
    teacher_directly: Path,
) -> None:
    held = HeldTeacher()

    async def body(client: httpx.AsyncClient) -> None:
        student = (await classify(client, threshold=0.0)).json()[0]
        held.hold()
        computing = asyncio.create_task(classify(client, threshold=None))  # started in time: waited for
        await until(lambda: _true(held.calls == 1))
        r = await classify(client, threshold=None)  # queued for the teacher past the budget: the student
        assert r.status_code == 200 and r.json()[0] == student
        assert r.headers["x-distilserve-answered-by"] == "cls"
        assert kept((await client.get("/metrics")).text, "late") == 1
        held.release()
        assert (await computing).json()[0][0]["model"] == TEACHER
        assert held.calls == 1

    run_with_client(settings_for(teacher_directly, cascade_budget_ms=300, max_queue=8), body, held)
