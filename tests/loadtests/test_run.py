"""`make loadtest` end to end: it starts the service, runs the locustfile, reports; on the tiny repository
every task's endpoints get traffic, on one of embedding models alone only theirs."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import Any

import httpx

from loadtests.report import Endpoint, read_endpoints, read_failures
from tests.service.live_server import free_port


def run_load(repository: Path, reports: Path, port: int, seconds: int = 8) -> tuple[Path, str]:
    """`python -m loadtests.run` against `repository` on `port`: its report directory and the service's
    log; it must exit 0 (no failure other than 429s)."""
    command = [sys.executable, "-m", "loadtests.run", "--port", str(port), "--model-repository"]
    command += [str(repository), "--time", f"{seconds}s", "--users", "4", "--spawn-rate", "4"]
    done = subprocess.run([*command, "--reports", str(reports)], capture_output=True, text=True, timeout=240)
    (out,) = reports.iterdir()
    log = (out / "service.log").read_text() if (out / "service.log").exists() else ""
    assert done.returncode == 0, done.stdout + done.stderr + log
    return out, log


def endpoints(out: Path) -> dict[tuple[str, str], Endpoint]:
    return {(e.method, e.name): e for e in read_endpoints(out / "locust", read_failures(out / "locust"))}


def test_a_short_run_serves_every_endpoint_and_reports(tiny_repository: Path, tmp_path: Path) -> None:
    port = free_port()
    out, log = run_load(tiny_repository, tmp_path, port)

    assert (out / "locust_final_stats.csv").exists()  # totals after the last request (the locustfile's)
    failures = read_failures(out / "locust")
    rows = endpoints(out)
    served = {name for (_, name), e in rows.items() if e.requests and name.startswith("/v1/")}
    assert {"/v1/classify", "/v1/qa", "/v1/fill-mask", "/v1/generate", "/v1/generate [stream]"} <= served
    assert rows[("SSE", "/v1/generate [stream] first token")].requests > 0
    assert any("[bad ->" in name for name in served)
    assert not [name for name in served if name.startswith(("/v1/embeddings", "/v1/rerank"))]
    assert not [f for f in failures if "429" not in f.error], failures

    report = (out / "report.md").read_text()
    assert (
        "| POST | `/v1/qa` |" in report
        and (out / "latency.png").exists()
        and (out / "throughput.png").exists()
    )
    assert "Application shutdown complete" in log  # the service it started was stopped (gracefully)
    try:
        httpx.get(f"http://127.0.0.1:{port}/health", timeout=1)
        raise AssertionError("the service still answers")
    except httpx.TransportError:
        pass


def test_a_repository_of_embedding_models_gets_embedding_traffic_only(
    embedding_pair: dict[str, Any], tmp_path: Path
) -> None:
    out, _ = run_load(embedding_pair["repository"], tmp_path, free_port(), seconds=6)
    served = {name: e.requests for (_, name), e in endpoints(out).items() if e.requests}
    assert served.get("/v1/embeddings", 0) > 0 and served.get("/v1/rerank", 0) > 0
    assert not [name for name in served if name.startswith(("/v1/classify", "/v1/qa", "/v1/generate"))]
    assert not read_failures(out / "locust")
