"""benchmarks.open_loop against a live service: requests go out at the rate asked whatever the server does,
and every one comes back as a reply, with its body, status and answer."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from benchmarks.open_loop import Reply, latency_ms, open_loop
from tests.conftest import TASK_MODEL_NAMES
from tests.service.live_server import live_server

CLS = TASK_MODEL_NAMES["text-classification"]


def test_every_request_of_an_open_loop_comes_back_with_its_status(tiny_repository: Path) -> None:
    bodies = [json.dumps({"inputs": text, "model": CLS}) for text in ("a fine film", "a dull one")]
    bodies.append(json.dumps({"inputs": "", "model": CLS}))  # refused: an empty text
    replies: list[Reply] = []
    with live_server(tiny_repository) as server:
        stats = open_loop(server.base_url, "/v1/classify", bodies, 40, 2.0, 4, replies)
    assert 30 <= len(replies) <= 140  # Poisson arrivals at 40/s for 2 s: 80 expected
    assert stats["offered_rps"] == pytest.approx(len(replies) / 2.0)
    for reply in replies:
        if reply.body == 2:
            assert reply.status == 422 and b"error" in reply.answer
        else:
            assert reply.status == 200 and json.loads(reply.answer)[0]["model"] == CLS
        assert reply.latency_s > 0
    assert stats["errors"] == sum(r.status != 200 for r in replies)
    assert stats["p99_ms"] >= stats["p50_ms"] > 0


def test_latency_percentiles_are_the_values_that_many_do_not_exceed() -> None:
    found = latency_ms([0.001 * i for i in range(1, 201)])  # 1 ms .. 200 ms
    assert found["p50_ms"] == pytest.approx(100.5) and found["p99_ms"] == pytest.approx(199.0)
    assert all(v != v for v in latency_ms([]).values())  # none: NaN, not a crash
