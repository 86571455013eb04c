"""Graceful shutdown: SIGTERM turns /ready to 503 at once, refuses new work, finishes what is in flight."""

from __future__ import annotations

import asyncio
import json
import signal
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from fastapi.testclient import TestClient

from service.app import create_app
from service.settings import Settings
from tests.service.slow_server import running_slow_server

IN_FLIGHT = 6


def test_a_draining_app_refuses_new_work_and_serves_reads(tiny_repository: Path) -> None:
    with TestClient(create_app(Settings(model_repository=tiny_repository, warmup=False))) as client:
        assert client.post("/v1/classify", json={"inputs": "a fine film"}).status_code == 200
        client.app.state.drain.begin()  # type: ignore[attr-defined]
        r = client.post("/v1/classify", json={"inputs": "a fine film"})
        assert r.status_code == 503 and r.json()["error_type"] == "unavailable"
        assert r.headers["connection"] == "close" and "X-Request-ID" in r.headers
        assert client.get("/v1/models").status_code == 200
        assert client.get("/health").status_code == 200


@pytest.fixture(params=[1, 2], ids=["one-frontend", "two-frontends"])
def slow_server(
    tiny_repository: Path, request: pytest.FixtureRequest
) -> Iterator[tuple[str, subprocess.Popen[str]]]:
    """The real entry point on 127.0.0.1, with each classification engine call taking 0.4 s; one frontend or
    two before the engine core (the supervisor forwards SIGTERM: every frontend drains, then the core)."""
    env = {
        "DISTILSERVE_FRONTENDS": str(request.param),
        "SLOW_ENGINE_S": "0.4",
        "DISTILSERVE_MAX_BATCH_SIZE": "2",
        "DISTILSERVE_MAX_BODY_BYTES": "16384",
        "DISTILSERVE_SHUTDOWN_GRACE_S": "20",
    }
    with running_slow_server(tiny_repository, env) as server:
        yield server


def in_flight(metrics: str) -> float:
    line = next(x for x in metrics.splitlines() if x.startswith("distilserve_requests_in_flight "))
    return float(line.split()[1])


async def drain_scenario(base: str, process: subprocess.Popen[str]) -> dict[str, Any]:
    async with httpx.AsyncClient(base_url=base, timeout=30) as client:
        pending = [
            asyncio.ensure_future(
                client.post(
                    "/v1/classify",
                    json={"inputs": f"film number {i}"},
                    headers={"X-Request-ID": f"drain-{i}"},
                )
            )
            for i in range(IN_FLIGHT)
        ]
        while in_flight((await client.get("/metrics")).text) < IN_FLIGHT:
            await asyncio.sleep(0.02)
        process.send_signal(signal.SIGTERM)
        while (ready := await client.get("/ready")).status_code == 200:
            await asyncio.sleep(0.01)
        still_running = sum(not p.done() for p in pending)
        late = await client.post(
            "/v1/classify", json={"inputs": "too late"}, headers={"X-Request-ID": "late"}
        )
        return {
            "ready": ready,
            "still_running": still_running,
            "late": late,
            "responses": await asyncio.gather(*pending),
        }


def test_sigterm_lets_in_flight_requests_finish(slow_server: tuple[str, subprocess.Popen[str]]) -> None:
    base, process = slow_server

    def chunks() -> Iterator[bytes]:
        for _ in range(32):
            yield b"x" * 1024

    big = httpx.post(f"{base}/v1/classify", content=chunks(), headers={"content-type": "application/json"})
    assert big.status_code == 413 and "X-Request-ID" in big.headers

    outcome = asyncio.run(drain_scenario(base, process))
    assert outcome["ready"].status_code == 503  # at once, on a new request, while work was still running
    assert outcome["still_running"] > 0
    assert outcome["late"].status_code == 503
    assert outcome["late"].json()["error_type"] == "unavailable"
    responses: list[httpx.Response] = outcome["responses"]
    assert [r.status_code for r in responses] == [200] * IN_FLIGHT
    assert all(len(r.json()) == 1 for r in responses)

    output, _ = process.communicate(timeout=30)
    assert process.returncode in (0, -signal.SIGTERM), output
    assert "draining for shutdown" in output and "Application shutdown complete" in output

    access = [json.loads(line) for line in output.splitlines() if line.startswith("{")]
    served = {a["request_id"]: a for a in access if a["request_id"].startswith("drain-")}
    assert sorted(served) == [f"drain-{i}" for i in range(IN_FLIGHT)]
    assert all(a["status"] == 200 and a["queue_ms"] is not None for a in served.values())
    assert max(a["inference_ms"] for a in served.values()) >= 400
    assert [a["status"] for a in access if a["request_id"] == "late"] == [503]
