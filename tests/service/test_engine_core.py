"""Two tiers: HTTP frontends in front of one engine core. Answers do not depend on the frontend; requests of
every frontend meet in the core's batches; a core that dies costs 503s, never a hung request; SIGTERM,
client disconnects and deadlines hold across the hop.

The classifier's engine in these services is gated (tests/service/gated_core.py), so a test knows what
is queued in the core and what was computed, without depending on timing.
"""

from __future__ import annotations

import asyncio
import json
import math
import os
import signal
import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from contextlib import ExitStack
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest
from asgi_lifespan import LifespanManager

from service.app import create_app
from service.settings import Settings
from tests.conftest import TASK_MODEL_NAMES
from tests.service.gated_core import Gated, start_gated
from tests.service.supervised import (
    Link,
    alive,
    all_ready,
    classify,
    connections_to,
    metric,
    readiness,
    wait_until,
)

CLS = TASK_MODEL_NAMES["text-classification"]
QA = TASK_MODEL_NAMES["question-answering"]
MLM = TASK_MODEL_NAMES["fill-mask"]
LM = TASK_MODEL_NAMES["text-generation"]
TEXT = {"inputs": "a fine film"}  # one length for every queued request: they may share a batch


@pytest.fixture(scope="module")
def services(
    tiny_repository: Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Callable[[], Gated]]:
    """One gated service shared by this module's tests, started again for a test after one that stopped it."""
    with ExitStack() as stack:
        current: list[Gated] = []

        def running() -> Gated:
            if not current or current[-1].service.process.poll() is not None:
                current.append(start_gated(stack, tiny_repository, tmp_path_factory.mktemp("gate")))
            current[-1].release()
            return current[-1]

        yield running


@pytest.fixture
def gated(services: Callable[[], Gated]) -> Iterator[Gated]:
    running = services()
    yield running
    running.release()  # whatever happened: nothing stays held


# -- answers -------------------------------------------------------------------------------------------------

CONTEXT = "Acme was founded by John Smith in 1950 in the city of Springfield."
QUESTIONS = ["Who founded Acme?", "When was Acme founded?"]
TEXTS = ["a wonderful film", "A dull, terrible film. I hated every minute of it."]
MASKED = ["I loved this [MASK].", "A dull [MASK], I hated it."]
PROMPT = "The film was"


def v2_body(tensors: dict[str, list[str]], **parameters: object) -> dict[str, Any]:
    inputs = [{"name": n, "shape": [len(d)], "datatype": "BYTES", "data": d} for n, d in tensors.items()]
    return {"inputs": inputs, **({"parameters": parameters} if parameters else {})}


REQUESTS: list[tuple[str, dict[str, Any]]] = [
    ("/v1/classify", {"inputs": TEXTS, "top_k": 2}),
    ("/v1/qa", {"inputs": [{"question": q, "context": CONTEXT} for q in QUESTIONS], "top_k": 2}),
    ("/v1/fill-mask", {"inputs": MASKED, "top_k": 3}),
    ("/v1/generate", {"prompt": PROMPT, "max_new_tokens": 8}),
    (f"/v2/models/{CLS}/infer", v2_body({"TEXT": TEXTS})),
    (f"/v2/models/{QA}/infer", v2_body({"QUESTION": QUESTIONS, "CONTEXT": [CONTEXT] * 2})),
    (f"/v2/models/{MLM}/infer", v2_body({"TEXT": MASKED}, top_k=3)),
    (f"/v2/models/{LM}/infer", v2_body({"PROMPT": [PROMPT]}, max_new_tokens=8)),
]


async def in_process_answers(repository: Path) -> list[tuple[int, Any]]:
    """The same requests answered by the app with its engine in this process."""
    app = create_app(Settings.model_validate({"model_repository": repository, "warmup": False}))
    async with LifespanManager(app) as manager:
        transport = httpx.ASGITransport(app=manager.app)
        async with httpx.AsyncClient(transport=transport, base_url="http://test", timeout=60) as client:
            return [((r := await client.post(p, json=b)).status_code, r.json()) for p, b in REQUESTS]


def assert_same(got: Any, expected: Any, where: str = "") -> None:
    """Equal, floats within float32 rounding (a different batch shape may round a score differently)."""
    if isinstance(expected, float) and isinstance(got, float | int):
        assert math.isclose(got, expected, rel_tol=1e-5, abs_tol=1e-6), (where, got, expected)
    elif isinstance(expected, dict):
        assert isinstance(got, dict) and got.keys() == expected.keys(), (where, got, expected)
        for key in expected:
            assert_same(got[key], expected[key], f"{where}.{key}")
    elif isinstance(expected, list):
        assert isinstance(got, list) and len(got) == len(expected), (where, got, expected)
        for i, (g, e) in enumerate(zip(got, expected, strict=True)):
            assert_same(g, e, f"{where}[{i}]")
    else:
        assert got == expected, (where, got, expected)


def test_every_frontend_answers_as_the_engine_in_one_process_does(
    gated: Gated, tiny_repository: Path
) -> None:
    """The four tasks on /v1 and /v2, asked through each of the two frontends."""
    expected = asyncio.run(in_process_answers(tiny_repository))
    assert [status for status, _ in expected] == [200] * len(REQUESTS), expected
    links = connections_to(gated.service.port, gated.frontends(), 1)
    for link in links:
        for (path, body), (_, answer) in zip(REQUESTS, expected, strict=True):
            got = link.request("POST", path, body)
            assert got.status == 200, (link.pid, path, got.body)
            assert_same(got.json(), answer, f"frontend {link.pid} {path}")
        link.close()


# -- batches -------------------------------------------------------------------------------------------------


def post(base_url: str, body: dict[str, Any] = TEXT, request_id: str = "") -> httpx.Response:
    headers = {"X-Request-ID": request_id} if request_id else {}
    return httpx.post(f"{base_url}/v1/classify", json=body, headers=headers, timeout=60)


def occupy_engine(gated: Gated, pool: ThreadPoolExecutor) -> tuple[int, Future[httpx.Response]]:
    """Hold the engine, send one request, and wait until its engine call has begun (and is held): what
    comes next queues in the engine core. The calls before it, and the request."""
    done = gated.hold()
    occupier = pool.submit(post, gated.service.base_url, TEXT, "occupier")
    wait_until(lambda: len(gated.calls()) == done + 1, 60, gated.calls)
    return done, occupier


def test_requests_through_two_frontends_meet_in_one_engine_batch(gated: Gated) -> None:
    before = gated.metrics()
    links = connections_to(gated.service.port, gated.frontends(), 3)
    with ThreadPoolExecutor(8) as pool:
        done, occupier = occupy_engine(gated, pool)
        queued = [
            pool.submit(link.request, "POST", "/v1/classify", TEXT, {"X-Request-ID": f"together-{i}"})
            for i, link in enumerate(links)
        ]
        wait_until(lambda: gated.queued() == len(links), 60, gated.queued)
        gated.release()
        answers = [q.result(timeout=60) for q in queued]
        assert occupier.result(timeout=60).status_code == 200
    for link in links:
        link.close()

    assert [a.status for a in answers] == [200] * len(links), [a.body for a in answers]
    assert all(len(a.json()) == 1 and set(a.json()[0]) == {"label", "score", "model"} for a in answers)
    assert gated.calls()[done:] == [1, len(links)]  # the occupier's call, then one call for all six
    after = gated.metrics()
    for series, grew_by in (
        ("distilserve_batch_size_count", 2),
        ("distilserve_batch_size_sum", 1 + len(links)),
    ):
        grew = metric(after, series, f'model="{CLS}"') - metric(before, series, f'model="{CLS}"')
        assert grew == grew_by, series
    assert len({link.pid for link in links}) == 2  # three of the six came through each frontend


def test_a_requests_priority_crosses_to_the_core_and_puts_it_first(gated: Gated) -> None:
    """Queued behind three texts of priority 0, one text of priority -1 is the core's next engine call."""
    base = gated.service.base_url
    with ThreadPoolExecutor(4) as pool:
        done, occupier = occupy_engine(gated, pool)
        ordinary = pool.submit(post, base, {"inputs": [TEXT["inputs"]] * 3}, "ordinary")
        wait_until(lambda: gated.queued() == 3, 60, gated.queued)
        hurried = pool.submit(post, base, {"inputs": TEXT["inputs"], "priority": -1}, "hurried")
        wait_until(lambda: gated.queued() == 4, 60, gated.queued)
        gated.release()
        assert [f.result(timeout=60).status_code for f in (occupier, ordinary, hurried)] == [200] * 3
    assert gated.calls()[done:] == [1, 1, 3]  # the occupier, the hurried text, then the three (else: 1, 4)
    bad = httpx.post(f"{base}/v1/classify", json={"inputs": "fine", "priority": 1.5}, timeout=60)
    assert bad.status_code == 422 and "priority" in bad.text


# -- client disconnects --------------------------------------------------------------------------------------


def send_and_leave_open(link: Link, request_id: str) -> None:
    """A classification request written to the connection; its answer is never read."""
    body = json.dumps(TEXT).encode()
    head = (
        f"POST /v1/classify HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
        f"X-Request-ID: {request_id}\r\nContent-Length: {len(body)}\r\n\r\n"
    )
    link.sock.sendall(head.encode() + body)


def test_a_client_that_leaves_has_its_work_dropped_from_the_core_queue(gated: Gated) -> None:
    before = gated.metrics()
    links = connections_to(gated.service.port, gated.frontends(), 2)
    with ThreadPoolExecutor(2) as pool:
        done, occupier = occupy_engine(gated, pool)
        for i, link in enumerate(links):
            send_and_leave_open(link, f"gone-{i}")
        wait_until(lambda: gated.queued() == len(links), 60, gated.queued)  # waiting in the core
        for link in links:
            link.close()  # the clients leave

        def left() -> float:
            now = gated.metrics()
            gone = 'status="499"'
            return metric(now, "distilserve_requests_total", gone) - metric(
                before, "distilserve_requests_total", gone
            )

        wait_until(lambda: left() == len(links), 60, left)
        # Their rows left the core's queue while the engine was still held: nothing of them runs.
        wait_until(lambda: gated.queued() == 0, 60, gated.queued)
        assert gated.calls()[done:] == [1]
        gated.release()
        assert occupier.result(timeout=60).status_code == 200

    assert gated.calls()[done:] == [1]
    batches = metric(gated.metrics(), "distilserve_batch_size_count", f'model="{CLS}"')
    assert batches - metric(before, "distilserve_batch_size_count", f'model="{CLS}"') == 1
    gone = {a["request_id"]: a for a in gated.access() if a["request_id"].startswith("gone-")}
    assert sorted(gone) == [f"gone-{i}" for i in range(len(links))]
    assert all(a["status"] == 499 and a["inference_ms"] is None for a in gone.values()), gone


# -- an engine core that dies --------------------------------------------------------------------------------


@dataclass
class Load:
    """Clients posting classifications in a loop, each answer (or error) written down."""

    base_url: str
    answers: list[tuple[bool, int, str | None]]  # (after the core was back, status, Retry-After)
    errors: list[BaseException]
    back: threading.Event
    stop: threading.Event

    def run(self) -> None:
        with httpx.Client(base_url=self.base_url, timeout=20) as client:  # no request may take longer
            while not self.stop.is_set():
                back = self.back.is_set()
                try:
                    r = client.post("/v1/classify", json=TEXT)
                except httpx.HTTPError as e:
                    self.errors.append(e)
                    continue
                self.answers.append((back, r.status_code, r.headers.get("retry-after")))
                if r.status_code != 200:
                    time.sleep(0.1)  # as a client told to retry later would


def test_an_engine_core_killed_under_load_answers_503_until_it_is_back(gated: Gated) -> None:
    service = gated.service
    core, frontends = service.wait_for_roles(lambda core, frontends: len(frontends) == 2)
    load = Load(service.base_url, [], [], threading.Event(), threading.Event())
    links = connections_to(service.port, set(frontends.values()), 1)
    with ThreadPoolExecutor(8) as pool:
        _, occupier = occupy_engine(gated, pool)
        waiting = [pool.submit(link.request, "POST", "/v1/classify", TEXT) for link in links]
        clients = [pool.submit(load.run) for _ in range(4)]
        wait_until(lambda: gated.queued() >= len(links) + 2, 60, gated.queued)  # requests wait in the core
        os.kill(core, signal.SIGKILL)
        gated.release()  # for the next core

        # What waited in the dead core (through either frontend) is answered at once: 503, retry later.
        for answer in [w.result(timeout=30) for w in waiting]:
            assert answer.status == 503 and answer.json()["error_type"] == "unavailable", answer.body
            assert int(answer.headers["retry-after"]) >= 1
        assert occupier.result(timeout=30).status_code == 503
        # Both frontends say they are not ready until the core is back (the supervisor starts another).
        assert [link.request("GET", "/ready").status for link in links] == [503, 503]
        for link in links:
            link.close()
        new_core, frontends_after = service.wait_for_roles(lambda c, f: c != core, timeout_s=120)
        wait_until(lambda: all_ready(service.port, set(frontends.values())), 120, lambda: service.output)
        load.back.set()
        wait_until(lambda: sum(a[0] and a[1] == 200 for a in load.answers) >= 8, 60, lambda: load.answers)
        load.stop.set()
        for c in clients:
            c.result(timeout=60)

    assert not load.errors, load.errors  # every request was answered, none hung past 20 s
    assert {status for _, status, _ in load.answers} <= {200, 503}, load.answers
    assert all(retry is not None and int(retry) >= 1 for _, status, retry in load.answers if status == 503)
    assert any(status == 503 for _, status, _ in load.answers)
    assert frontends_after == frontends and new_core != core and not alive(core)
    assert classify(service.base_url) == 200
    assert f"engine core (pid {core}) exited with -9; starting another in" in service.output


# -- shutdown ------------------------------------------------------------------------------------------------


def test_sigterm_lets_requests_in_flight_through_both_frontends_finish(gated: Gated) -> None:
    service = gated.service
    frontends = gated.frontends()
    links = connections_to(service.port, frontends, 3)
    with ThreadPoolExecutor(8) as pool:
        done, occupier = occupy_engine(gated, pool)
        in_flight = [
            pool.submit(link.request, "POST", "/v1/classify", TEXT, {"X-Request-ID": f"drain-{i}"})
            for i, link in enumerate(links)
        ]
        wait_until(lambda: gated.queued() == len(links), 60, gated.queued)  # queued in the core
        service.process.send_signal(signal.SIGTERM)
        # Every frontend turns not ready and refuses new work, while what it admitted is still held.
        wait_until(lambda: readiness(service.port, frontends) == [503, 503], 60)
        for link in connections_to(service.port, frontends, 1):
            late = link.request("POST", "/v1/classify", TEXT, {"X-Request-ID": "late"})
            assert late.status == 503 and late.json()["error_type"] == "unavailable", late.body
            link.close()
        assert not occupier.done() and not any(f.done() for f in in_flight)
        gated.release()
        answers = [f.result(timeout=60) for f in in_flight]
        assert occupier.result(timeout=60).status_code == 200

    assert [a.status for a in answers] == [200] * len(links), [a.body for a in answers]
    assert all(len(a.json()) == 1 for a in answers)
    assert service.stop() == 0, service.output
    assert gated.calls()[done:] == [1, len(links)]
    assert service.output.count("draining for shutdown") == 2  # each frontend drained
    assert "engine core: stopping; finishing queued work" in service.output
    served = {a["request_id"]: a["status"] for a in gated.access() if a["request_id"].startswith("drain-")}
    assert served == {f"drain-{i}": 200 for i in range(len(links))}
    assert [a["status"] for a in gated.access() if a["request_id"] == "late"] == [503, 503]


# -- deadlines -----------------------------------------------------------------------------------------------


@pytest.fixture
def impatient(tiny_repository: Path, tmp_path: Path) -> Iterator[Gated]:
    """A gated service whose requests have 1 s to reach the engine."""
    with ExitStack() as stack:
        yield start_gated(stack, tiny_repository, tmp_path, {"DISTILSERVE_REQUEST_TIMEOUT_S": "1"})


def test_a_request_whose_deadline_passes_in_the_core_queue_gets_504(impatient: Gated) -> None:
    links = connections_to(impatient.service.port, impatient.frontends(), 2)
    with ThreadPoolExecutor(8) as pool:
        done, occupier = occupy_engine(impatient, pool)
        queued = [pool.submit(link.request, "POST", "/v1/classify", TEXT) for link in links]
        # Answered while the engine is still held: dropped from the core's queue, never computed.
        answers = [q.result(timeout=60) for q in queued]
        assert impatient.calls()[done:] == [1]
        impatient.release()
        assert occupier.result(timeout=60).status_code == 200  # it had reached the engine: waited for
    for link in links:
        link.close()
    assert [a.status for a in answers] == [504] * len(links), [a.body for a in answers]
    assert all(a.json()["error_type"] == "timeout" for a in answers)
    assert impatient.calls()[done:] == [1]
    assert impatient.queued() == 0
