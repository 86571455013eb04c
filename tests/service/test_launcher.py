"""`python -m service`: one engine core and N HTTP frontends on one port behind a supervisor that keeps them
running: metrics summed over every process, a dead or hung process replaced, a crash loop slowed down, a
start-up failure stopping everything."""

from __future__ import annotations

import os
import re
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from service.engine import available_cores
from tests.service.supervised import (
    Service,
    accepted_connections,
    alive,
    all_ready,
    classified,
    classify,
    listening,
    metric,
    ready,
    serving,
    supervised,
    supervised_ever,
    wait_until,
)

ROOT = Path(__file__).resolve().parents[2]
FRONTENDS = 2
HUNG_AFTER_S = 4  # DISTILSERVE_WORKER_TIMEOUT_S of the shared server: long enough for a loaded machine


# -- one service shared by the tests that leave it running ---------------------------------------------------


@pytest.fixture(scope="module")
def service(tiny_repository: Path) -> Iterator[Service]:
    env = {"DISTILSERVE_FRONTENDS": str(FRONTENDS), "DISTILSERVE_WORKER_TIMEOUT_S": str(HUNG_AFTER_S)}
    with serving(tiny_repository, env) as running:
        running.wait_for_roles(lambda core, frontends: len(frontends) == FRONTENDS)
        yield running
        assert running.stop() == 0, running.output
        assert not {pid for pid in supervised_ever(running) if alive(pid)}


def test_the_engine_cores_resident_memory_is_scraped_from_any_frontend(service: Service) -> None:
    """The core sets its resident set each second; a frontend's /metrics carries it (what an operator's
    memory alert reads: the weights live in the core, not in the frontends)."""
    core, _ = service.wait_for_roles(lambda core, frontends: len(frontends) == FRONTENDS)
    name = "distilserve_engine_core_resident_memory_bytes"

    def scraped() -> float:
        return metric(httpx.get(f"{service.base_url}/metrics", timeout=60).text, name)

    wait_until(lambda: scraped() > 0, 30)
    pages = int(Path(f"/proc/{core}/statm").read_text().split()[1])
    actual = pages * os.sysconf("SC_PAGE_SIZE")
    assert abs(scraped() - actual) < 0.25 * actual


def test_frontends_share_the_port_and_their_metrics_and_a_dead_one_is_replaced(service: Service) -> None:
    core, frontends = service.wait_for_roles(lambda core, frontends: len(frontends) == FRONTENDS)
    assert not listening(core, service.port)  # only frontends speak HTTP; the core is behind them

    cards = httpx.get(f"{service.base_url}/v1/models", timeout=60).json()["models"]
    plans = {(c["instances"], c["threads_per_instance"]) for c in cards if c["task"] != "text-generation"}
    assert plans == {(available_cores(), 1)}  # one engine core: every model gets the whole machine

    before = classified(service.base_url)
    assert [classify(service.base_url) for _ in range(30)] == [200] * 30
    assert [classified(service.base_url) for _ in range(6)] == [before + 30] * 6

    victim = frontends[1]
    os.kill(victim, signal.SIGKILL)
    wait_until(lambda: not alive(victim), 30)
    # The other frontend keeps answering (the port is its alone) while the supervisor starts a replacement.
    assert [classify(service.base_url) for _ in range(10)] == [200] * 10
    core_after, replaced = service.wait_for_roles(lambda c, f: f.get(1, victim) != victim)
    assert core_after == core and replaced[2] == frontends[2]  # the others went on
    newcomer = replaced[1]
    # It listens once it knows what the core serves; from then on new connections reach it too.
    deadline = time.monotonic() + 60
    while True:
        clients = [socket.create_connection(("127.0.0.1", service.port)) for _ in range(16)]
        time.sleep(0.3)
        accepted = accepted_connections(newcomer, service.port)
        for client in clients:
            client.close()
        if accepted or time.monotonic() > deadline:
            break
    assert accepted > 0
    assert [classify(service.base_url) for _ in range(10)] == [200] * 10
    # A dead frontend's counts stay in the sum (prometheus_client's multiprocess files outlive it).
    assert classified(service.base_url) == before + 50
    assert re.search(rf"frontend 1 \(pid {victim}\) exited with -9; starting another in", service.output)


def test_connections_opened_at_once_are_spread_over_the_frontends(service: Service) -> None:
    """Each frontend listens on its own SO_REUSEPORT socket; on one shared socket the first one to wake
    would accept the whole burst."""
    _, frontends = service.wait_for_roles(lambda core, frontends: len(frontends) == FRONTENDS)
    pids = set(frontends.values())
    clients = [socket.create_connection(("127.0.0.1", service.port)) for _ in range(32)]
    try:
        deadline = time.monotonic() + 30
        while sum(counts := [accepted_connections(p, service.port) for p in pids]) < 32:
            assert time.monotonic() < deadline, counts
            time.sleep(0.1)
        assert min(counts) >= 4, counts  # binomial(32, 1/2): fewer than 4 has odds of ~1e-6
    finally:
        for client in clients:
            client.close()


def test_a_frontend_whose_event_loop_stops_ticking_is_killed_and_replaced(service: Service) -> None:
    """A stopped process stands in for a stuck event loop: alive, its socket open, answering nobody."""
    core, frontends = service.wait_for_roles(lambda core, frontends: len(frontends) == FRONTENDS)
    hung = frontends[2]
    os.kill(hung, signal.SIGSTOP)
    core_after, replaced = service.wait_for_roles(lambda c, f: f.get(2, hung) != hung, timeout_s=120)
    assert not alive(hung)
    assert core_after == core and replaced[1] == frontends[1]  # the healthy ones are left alone
    wait_until(lambda: ready(service), 60)
    assert [classify(service.base_url) for _ in range(10)] == [200] * 10
    assert re.search(rf"frontend 2 \(pid {hung}\): its event loop has not ticked for", service.output)
    assert re.search(rf"frontend 2 \(pid {hung}\) exited with -9; starting another in", service.output)


def test_an_engine_core_whose_event_loop_stops_ticking_is_killed_and_replaced(service: Service) -> None:
    core, frontends = service.wait_for_roles(lambda core, frontends: len(frontends) == FRONTENDS)
    os.kill(core, signal.SIGSTOP)
    # A request sent to the stuck core waits for it, not forever: when the core is killed, 503 at once.
    waiting = httpx.post(f"{service.base_url}/v1/classify", json={"inputs": "a fine film"}, timeout=60)
    assert waiting.status_code == 503, waiting.text
    assert int(waiting.headers["retry-after"]) >= 1
    new_core, frontends_after = service.wait_for_roles(lambda c, f: c != core, timeout_s=120)
    assert not alive(core)
    assert frontends_after == frontends  # the frontends stay, and reconnect to the new core
    port, pids = service.port, set(frontends.values())
    wait_until(lambda: all_ready(port, pids), 90, lambda: service.output)
    assert [classify(service.base_url) for _ in range(10)] == [200] * 10
    assert re.search(rf"engine core \(pid {core}\): its event loop has not ticked for", service.output)
    assert re.search(rf"engine core \(pid {core}\) exited with -9; starting another in", service.output)
    assert new_core in supervised(service.pid)


# -- start-up and crash loops: a service of their own --------------------------------------------------------


def supervisor_command(module: str, repository: Path, port: int = 0) -> list[str]:
    """Two frontends; a short grace period, as nothing is in flight when these stop."""
    return [
        sys.executable,
        *("-m", module),
        *("--port", str(port), "--frontends", "2", "--shutdown-grace-s", "2"),
        *("--model-repository", str(repository), "--warmup", "false"),
    ]


def test_a_core_that_cannot_start_stops_the_supervisor(tmp_path: Path) -> None:
    done = subprocess.run(
        supervisor_command("service", tmp_path), capture_output=True, text=True, timeout=180, check=False
    )
    assert done.returncode == 3, done.stderr  # uvicorn's start-up failure code, as one process exits
    assert "no servable model" in done.stderr
    assert "the engine core could not start; stopping the others" in done.stderr
    # Frontends still waiting for the core have nothing to drain: they stop on the supervisor's SIGTERM.
    assert "still running past the grace period" not in done.stderr, done.stderr


def test_a_port_in_use_stops_the_supervisor_before_anything_starts(tmp_path: Path) -> None:
    with socket.create_server(("127.0.0.1", 0)) as taken:
        port = taken.getsockname()[1]
        done = subprocess.run(
            supervisor_command("service", tmp_path, port),
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )
    assert done.returncode == 3, done.stderr
    assert f"cannot bind 127.0.0.1:{port}" in done.stderr
    assert "engine core: pid" not in done.stderr and "frontend 1: pid" not in done.stderr


def test_a_core_that_keeps_dying_young_is_restarted_ever_later(tiny_repository: Path) -> None:
    """crashing_server's engine factory runs in the engine core, which dies loading the classifier."""
    supervisor = subprocess.Popen(
        supervisor_command("tests.service.crashing_server", tiny_repository),
        cwd=ROOT,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    delays: list[float] = []
    lines: list[str] = []
    assert supervisor.stderr is not None
    try:
        deadline = time.monotonic() + 120
        while len(delays) < 2 and time.monotonic() < deadline:  # the core's first two deaths
            line = supervisor.stderr.readline()
            if not line:
                break
            lines.append(line)
            if "engine core (pid" in line and "exited with 1; starting another in" in line:
                delays.append(float(line.rsplit("in ", 1)[1].split()[0]))
        supervisor.send_signal(signal.SIGTERM)  # pending restarts are dropped: it stops at once
        _, rest = supervisor.communicate(timeout=120)
    finally:
        if supervisor.poll() is None:
            supervisor.kill()
            supervisor.communicate()
    output = "".join(lines) + rest
    assert delays == [1.0, 2.0], output
    assert supervisor.returncode == 0, output
    assert not re.search(r"frontend \d+ \(pid \d+\) exited", output)  # the frontends waited for a core
    # ... and, never having admitted anything, stop on the supervisor's SIGTERM.
    assert "still running past the grace period" not in output, output
