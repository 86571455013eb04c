"""`make loadtest` end to end on the tiny repository: it starts the service, runs the locustfile, reports."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import httpx

from loadtests.report import read_endpoints, read_failures
from tests.service.live_server import free_port


def test_a_short_run_serves_every_endpoint_and_reports(tiny_repository: Path, tmp_path: Path) -> None:
    port = free_port()
    command = [sys.executable, "-m", "loadtests.run", "--port", str(port), "--model-repository"]
    command += [str(tiny_repository), "--time", "8s", "--users", "4", "--spawn-rate", "4"]
    done = subprocess.run([*command, "--reports", str(tmp_path)], capture_output=True, text=True, timeout=240)
    (out,) = tmp_path.iterdir()
    log = (out / "service.log").read_text() if (out / "service.log").exists() else ""
    assert done.returncode == 0, done.stdout + done.stderr + log  # no failure other than 429s

    assert (out / "locust_final_stats.csv").exists()  # totals after the last request (the locustfile's)
    failures = read_failures(out / "locust")
    rows = {(e.method, e.name): e for e in read_endpoints(out / "locust", failures)}
    served = {name for (_, name), e in rows.items() if e.requests and name.startswith("/v1/")}
    assert {"/v1/classify", "/v1/qa", "/v1/fill-mask", "/v1/generate", "/v1/generate [stream]"} <= served
    assert rows[("SSE", "/v1/generate [stream] first token")].requests > 0
    assert any("[bad ->" in name for name in served)
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
