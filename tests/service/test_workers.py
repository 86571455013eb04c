"""`--workers N`: N whole servers on one port behind a supervisor, metrics summed, a dead one replaced."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path
from urllib.parse import urlsplit

import httpx

from service.engine import available_cores
from tests.service.live_server import live_server

WORKERS = {"DISTILSERVE_WORKERS": "2", "DISTILSERVE_LOG_LEVEL": "warning", "DISTILSERVE_WARMUP": "false"}


def worker_pids(supervisor: int) -> set[int]:
    """The supervisor's worker processes (multiprocessing's resource tracker is a child too)."""
    children = Path(f"/proc/{supervisor}/task/{supervisor}/children").read_text().split()
    return {int(c) for c in children if b"spawn_main" in Path(f"/proc/{c}/cmdline").read_bytes()}


def classified(base_url: str) -> float:
    """Successful classifications so far, as one scrape of whichever worker answers reports them."""
    text = httpx.get(f"{base_url}/metrics").text  # a new connection each time: any worker may answer
    return sum(
        float(line.split()[-1])
        for line in text.splitlines()
        if line.startswith("distilserve_requests_total{")
        and 'task="text-classification"' in line
        and 'status="200"' in line
    )


def wait_for_workers(supervisor: int, count: int, not_in: set[int], timeout_s: float = 60) -> set[int]:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        pids = worker_pids(supervisor)
        if len(pids) == count and not pids & not_in:
            return pids
        time.sleep(0.2)
    raise TimeoutError(f"wanted {count} workers other than {not_in}, have {worker_pids(supervisor)}")


def classify(base_url: str) -> int:
    return httpx.post(f"{base_url}/v1/classify", json={"inputs": "a fine film"}, timeout=30).status_code


def test_workers_share_the_port_and_their_metrics_and_a_dead_one_is_replaced(tiny_repository: Path) -> None:
    with live_server(tiny_repository, WORKERS) as server:
        supervisor = server.process.pid
        first = worker_pids(supervisor)
        assert len(first) == 2

        share = max(1, available_cores() // 2)  # each worker plans on its half of the cores
        cards = httpx.get(f"{server.base_url}/v1/models").json()["models"]
        assert {c["workers"] for c in cards} == {2}
        plans = {(c["instances"], c["threads_per_instance"]) for c in cards if c["task"] != "text-generation"}
        assert plans == {(share, 1)}

        assert [classify(server.base_url) for _ in range(30)] == [200] * 30
        assert [classified(server.base_url) for _ in range(6)] == [30.0] * 6

        victim = min(first)
        subprocess.run(["kill", "-9", str(victim)], check=True)
        # The other worker keeps answering while the supervisor starts a replacement.
        assert [classify(server.base_url) for _ in range(10)] == [200] * 10
        replaced = wait_for_workers(supervisor, 2, not_in={victim})
        assert len(replaced & first) == 1
        (newcomer,) = replaced - first
        port = urlsplit(server.base_url).port
        assert port is not None
        deadline = time.monotonic() + 60  # it listens once loaded: then new connections reach it too
        while True:
            clients = [socket.create_connection(("127.0.0.1", port)) for _ in range(16)]
            time.sleep(0.3)
            accepted = accepted_connections(newcomer, port)
            for client in clients:
                client.close()
            if accepted or time.monotonic() > deadline:
                break
        assert accepted > 0
        assert [classify(server.base_url) for _ in range(10)] == [200] * 10
        # A dead worker's counts stay in the sum (prometheus_client's multiprocess files outlive it).
        assert classified(server.base_url) == 50.0

        assert server.stop() == 0, server.output
    assert "exited with -9; starting another" in server.output
    assert not worker_pids_alive(replaced | first)


def worker_pids_alive(pids: set[int]) -> set[int]:
    return {p for p in pids if Path(f"/proc/{p}").exists()}


def accepted_connections(pid: int, port: int) -> int:
    """Established TCP connections to `port` that process `pid` has accepted (its socket fds)."""
    inodes = set()
    for fd in Path(f"/proc/{pid}/fd").iterdir():
        try:
            target = os.readlink(fd)
        except OSError:  # closed meanwhile
            continue
        if target.startswith("socket:["):
            inodes.add(target[len("socket:[") : -1])
    count = 0
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        for line in Path(table).read_text().splitlines()[1:]:
            fields = line.split()
            local_port, state, inode = int(fields[1].rsplit(":", 1)[1], 16), fields[3], fields[9]
            count += state == "01" and local_port == port and inode in inodes
    return count


def test_connections_opened_at_once_are_spread_over_the_workers(tiny_repository: Path) -> None:
    """Each worker listens on its own SO_REUSEPORT socket; on one shared socket the first worker to wake
    would accept the whole burst."""
    with live_server(tiny_repository, WORKERS) as server:
        pids = worker_pids(server.process.pid)
        port = urlsplit(server.base_url).port
        assert port is not None
        clients = [socket.create_connection(("127.0.0.1", port)) for _ in range(32)]
        try:
            deadline = time.monotonic() + 20
            while sum(counts := [accepted_connections(p, port) for p in pids]) < 32:
                assert time.monotonic() < deadline, counts
                time.sleep(0.1)
            assert min(counts) >= 4, counts  # binomial(32, 1/2): fewer than 4 has odds of ~1e-6
        finally:
            for client in clients:
                client.close()


def test_a_worker_that_cannot_start_stops_the_supervisor(tmp_path: Path) -> None:
    command = [sys.executable, "-m", "service", "--port", "0", "--model-repository", str(tmp_path)]
    done = subprocess.run(
        [*command, "--workers", "2"], capture_output=True, text=True, timeout=120, check=False
    )
    assert done.returncode == 3, done.stderr  # uvicorn's start-up failure code, as one process exits
    assert "no servable model" in done.stderr
    assert "could not start; stopping the others" in done.stderr


def test_a_port_in_use_stops_the_supervisor_before_any_worker_starts(tmp_path: Path) -> None:
    with socket.create_server(("127.0.0.1", 0)) as taken:
        port = taken.getsockname()[1]
        command = [sys.executable, "-m", "service", "--port", str(port), "--workers", "2"]
        done = subprocess.run(
            [*command, "--model-repository", str(tmp_path)],
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )
    assert done.returncode == 3, done.stderr
    assert f"cannot bind 127.0.0.1:{port}" in done.stderr and "worker 0" not in done.stderr


def test_a_worker_that_keeps_dying_young_is_restarted_ever_later(tiny_repository: Path) -> None:
    root = Path(__file__).resolve().parents[2]
    command = [sys.executable, "-m", "tests.service.crashing_server", "--port", "0", "--workers", "2"]
    supervisor = subprocess.Popen(
        [*command, "--model-repository", str(tiny_repository)],
        cwd=root,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    delays: list[float] = []
    lines: list[str] = []
    assert supervisor.stderr is not None
    deadline = time.monotonic() + 120
    while len(delays) < 2 and time.monotonic() < deadline:  # worker 0's first two deaths
        line = supervisor.stderr.readline()
        lines.append(line)
        if "worker 0 (pid" in line and "starting another in" in line:
            delays.append(float(line.rsplit("in ", 1)[1].split()[0]))
    supervisor.send_signal(signal.SIGTERM)  # pending restarts are dropped: it stops at once
    rest, _ = supervisor.communicate(timeout=60)
    assert delays == [1.0, 2.0], "".join(lines)
    assert supervisor.returncode == 0, rest


def test_a_worker_whose_event_loop_stops_ticking_is_killed_and_replaced(tiny_repository: Path) -> None:
    """A stopped process stands in for a stuck event loop: alive, its socket open, answering nobody."""
    with live_server(tiny_repository, {**WORKERS, "DISTILSERVE_WORKER_TIMEOUT_S": "2"}) as server:
        supervisor = server.process.pid
        first = worker_pids(supervisor)
        time.sleep(3)  # both beat: a healthy worker is left alone
        assert worker_pids(supervisor) == first
        hung = min(first)
        os.kill(hung, signal.SIGSTOP)
        replaced = wait_for_workers(supervisor, 2, not_in={hung}, timeout_s=30)
        assert replaced & first == first - {hung}
        assert not worker_pids_alive({hung})
        assert [classify(server.base_url) for _ in range(10)] == [200] * 10
        assert server.stop() == 0, server.output
    assert "its event loop has not ticked for" in server.output
    assert "exited with -9; starting another" in server.output
