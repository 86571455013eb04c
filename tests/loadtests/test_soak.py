"""`make soak` on the tiny repository, and its arithmetic on made-up samples: every process of the service
is sampled, errors are counted apart from deliberate bad input, a growing process or a leaking descriptor
fails its bar."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

from loadtests.process_memory import ProcessSample, sample_tree
from loadtests.report import AGGREGATED, Endpoint, Failure
from loadtests.soak_report import Snapshot, Soak, Traffic, growth_of, holds, verdict


def test_a_short_soak_samples_every_process_and_counts_bad_input_apart(
    tiny_repository: Path, tmp_path: Path
) -> None:
    command = [sys.executable, "-m", "loadtests.soak", "run", "--repository", str(tiny_repository)]
    command += ["--minutes", "0.15", "--users", "4", "--spawn-rate", "4", "--interval", "1"]
    command += ["--frontends", "2", "--out", str(tmp_path / "out"), "--work", str(tmp_path / "work")]
    env = {**os.environ, "DISTILSERVE_PROGRESS_INTERVAL_S": "2"}
    done = subprocess.run(command, capture_output=True, text=True, timeout=120, env=env)
    (folder,) = (tmp_path / "work").iterdir()
    log = (folder / "service.log").read_text()
    assert done.returncode == 0, done.stdout + done.stderr + log[-3000:]
    assert "soak: 0:0" in done.stderr  # the plain progress line, with the requests so far
    assert "requests " in done.stderr

    data = json.loads((tmp_path / "out" / "soak.json").read_text())
    snapshots = data["snapshots"]
    assert len(snapshots) >= 6  # one a second over 9 s of load
    expected = {"supervisor", "ds-engine-core", "ds-frontend-1", "ds-frontend-2"}
    for snapshot in snapshots:
        processes = {p["name"]: p for p in snapshot["processes"]}
        assert expected <= set(processes), processes
        assert all(p["rss_mib"] > 5 and p["fds"] > 2 for p in processes.values())
    assert data["after"] is not None and {p["name"] for p in data["after"]["processes"]} >= expected

    traffic = data["traffic"]
    assert traffic["requests"] > 20 and traffic["errors"] == 0, traffic
    assert traffic["bad_input"] > 0 and traffic["bad_input_wrong"] == 0  # their 4xx, and apart
    stats = (folder / "locust_final_stats.csv").read_text()
    for endpoint in ("/v1/completions", "/v2/models/[", "/v1/generate [stream]", "/v1/qa"):
        assert endpoint in stats, endpoint

    report = (tmp_path / "out" / "soak.md").read_text()
    assert "| `ds-engine-core` |" in report and "| **all** |" in report
    assert "- frontends: 2\n" in report and "other work on the machine" in report  # what shared the cores
    assert (tmp_path / "out" / "soak.png").stat().st_size > 10_000
    assert "Application shutdown complete" in log  # the service it started was stopped, gracefully


def test_every_process_of_a_tree_is_read_and_named() -> None:
    """The root is the supervisor; children of one name are numbered in pid order."""
    sleeper = "import time; time.sleep(30)"
    spawns_two = (
        f"import subprocess as s, sys, time; [s.Popen([sys.executable, '-c', {sleeper!r}]) for _ in '12']"
    )
    root = subprocess.Popen([sys.executable, "-c", spawns_two + "; time.sleep(30)"])
    try:
        deadline = time.monotonic() + 10
        while len(samples := sample_tree(root.pid)) < 3 and time.monotonic() < deadline:
            time.sleep(0.05)
        command = Path(sys.executable).name[:15]  # the kernel's name for it: python, python3, python3.11...
        assert [s.name for s in samples] == ["supervisor", f"{command}-1", f"{command}-2"]
        assert samples[0].pid == root.pid
        assert all(s.rss_mib > 1 and s.fds >= 3 for s in samples)
    finally:
        for s in sample_tree(root.pid)[::-1]:
            os.kill(s.pid, 9)
        root.wait()


def snapshot(t_s: float, core_mib: float, frontend_fds: int, frontend_pid: int = 3) -> Snapshot:
    return Snapshot(
        t_s,
        [
            ProcessSample("supervisor", 1, 90.0, 14),
            ProcessSample("ds-engine-core", 2, core_mib, 25),
            ProcessSample("ds-frontend", frontend_pid, 120.0, frontend_fds),
        ],
    )


NO_ERRORS = Traffic(requests=1000, errors=0, too_many=0, bad_input=80, bad_input_wrong=0, rps=10.0)


def test_growth_is_measured_from_the_first_minute_and_a_growing_process_is_named() -> None:
    steady = [snapshot(t, 500.0 if t < 60 else 560.0, 38) for t in range(0, 600, 30)]
    soak = Soak({}, NO_ERRORS, [snapshot(0, 400.0, 28), *steady[1:]], after=snapshot(601, 560.0, 28))
    rows = {r.name: r for r in growth_of(soak)}
    core = rows["ds-engine-core"]
    assert (core.rss_start_mib, core.rss_settled_mib, core.rss_end_mib) == (400.0, 560.0, 560.0)
    assert core.growth == 0.0 and rows["total"].rss_settled_mib == 90 + 560 + 120
    assert (rows["ds-frontend"].fds_start, rows["ds-frontend"].fds_after) == (28, 28)
    assert holds(soak)

    leaking = [snapshot(t, 560.0 + t / 5, 38) for t in range(0, 600, 30)]  # 572 MiB at 1 min, 674 at the end
    lines = verdict(Soak({}, NO_ERRORS, leaking))
    assert "the most ds-engine-core +17.8% ✘" in lines[1]
    assert not holds(Soak({}, NO_ERRORS, leaking))


def test_descriptors_that_outlive_the_clients_or_keep_growing_fail_the_bar() -> None:
    steady = [snapshot(t, 500.0, 38) for t in range(0, 300, 30)]
    assert holds(Soak({}, NO_ERRORS, steady, after=snapshot(301, 500.0, 40)))  # within the slack
    assert not holds(Soak({}, NO_ERRORS, steady, after=snapshot(301, 500.0, 60)))  # sockets left open
    growing = [snapshot(t, 500.0, 38 + t // 10) for t in range(0, 300, 30)]
    line = verdict(Soak({}, NO_ERRORS, growing))[2]
    assert line.startswith("- file descriptors flat") and line.endswith("✘")
    restarted = [*steady, snapshot(300, 500.0, 38, frontend_pid=9)]
    assert verdict(Soak({}, NO_ERRORS, restarted))[-1] == "- no process restarted: ds-frontend 1 times ✘"


def endpoint(name: str, requests: int, failures: int, too_many: int = 0) -> Endpoint:
    return Endpoint("POST", name, requests, failures, 1.0, 1.0, 2.0, 3.0, 4.0, too_many)


def test_errors_are_counted_apart_from_bad_input_answered_with_its_4xx() -> None:
    endpoints = [
        endpoint("/v1/classify", 500, 2, too_many=1),
        endpoint("/v1/classify [bad -> 422]", 40, 0),
        endpoint("/v1/qa [bad -> 422]", 30, 1),  # one got something else than its 422
        endpoint(AGGREGATED, 570, 3, too_many=1),
    ]
    failures = [Failure("POST", "/v1/classify", "429 Too Many Requests", 1)]
    traffic = Traffic.of(endpoints, failures)
    assert (traffic.requests, traffic.errors, traffic.too_many) == (570, 3, 1)
    assert (traffic.bad_input, traffic.bad_input_wrong) == (69, 1)
    assert (
        verdict(Soak({}, traffic, []))[0] == "- errors 0 apart from deliberate bad input: 3 (1 of them 429) ✘"
    )
