"""`python -m service`: one engine core and N HTTP frontends on one port behind a supervisor that keeps them
running: metrics summed over every process, a dead or hung process replaced, a crash loop slowed down, a
start-up failure stopping everything."""

from __future__ import annotations

import contextlib
import http.client
import json
import os
import re
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import pytest

from service.engine import available_cores
from tests.service.live_server import free_port

ROOT = Path(__file__).resolve().parents[2]
FRONTENDS = 2
HUNG_AFTER_S = 4  # DISTILSERVE_WORKER_TIMEOUT_S of the shared server: long enough for a loaded machine


# -- a supervised service whose log can be read while it runs ------------------------------------------------


@dataclass
class Service:
    """`python -m service` (or a module that calls service.__main__.main) in a subprocess; its output is
    read as it comes (a full pipe would block the server), so a test can look for log lines at any time."""

    process: subprocess.Popen[str]
    port: int
    lines: list[str] = field(default_factory=list)
    _reader: threading.Thread | None = None

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def pid(self) -> int:
        return self.process.pid

    @property
    def output(self) -> str:
        return "".join(self.lines)

    def read(self) -> None:
        assert self.process.stdout is not None
        self._reader = threading.Thread(target=self._read, args=(self.process.stdout,), daemon=True)
        self._reader.start()

    def _read(self, stream: Any) -> None:
        for line in stream:
            self.lines.append(line)

    def stop(self, timeout_s: float = 90) -> int:
        """SIGTERM to the supervisor, then wait for it: its exit code."""
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
        code = self.process.wait(timeout_s)
        if self._reader is not None:
            self._reader.join(10)
        return code

    def roles(self) -> tuple[int, dict[int, int]]:
        """The engine core's pid and each frontend's (by index), as the supervisor last logged them."""
        core = [int(m) for m in re.findall(r"engine core: pid (\d+)", self.output)]
        frontends = {int(k): int(p) for k, p in re.findall(r"frontend (\d+): pid (\d+)", self.output)}
        assert core, self.output
        return core[-1], frontends

    def wait_for_roles(
        self, condition: Callable[[int, dict[int, int]], bool], timeout_s: float = 90
    ) -> tuple[int, dict[int, int]]:
        """The roles once `condition` holds for them and every process named is a live child listening
        where it should (frontends on the port, the core not)."""
        deadline = time.monotonic() + timeout_s
        while True:
            core, frontends = self.roles()
            children = supervised(self.pid)
            if (
                condition(core, frontends)
                and children == {core, *frontends.values()}
                and all(listening(pid, self.port) for pid in frontends.values())
            ):
                return core, frontends
            if time.monotonic() > deadline:
                raise TimeoutError(f"roles {core}, {frontends}; children {children}\n{self.output}")
            time.sleep(0.1)


@contextmanager
def serving(
    repository: Path,
    env: dict[str, str],
    module: str = "service",
    args: tuple[str, ...] = (),
    ready_timeout_s: float = 120,
) -> Iterator[Service]:
    """The service on a free 127.0.0.1 port, once /ready answers 200; killed afterwards if still running."""
    port = free_port()
    command = [sys.executable, *(["-m", module] if module else []), *args]
    command += ["--port", str(port), "--model-repository", str(repository)]
    process = subprocess.Popen(
        command,
        cwd=ROOT,
        env={**os.environ, "DISTILSERVE_WARMUP": "false", **env},
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    service = Service(process, port)
    service.read()
    try:
        wait_until(lambda: ready(service), ready_timeout_s, lambda: service.output)
        yield service
    finally:
        if process.poll() is None:
            process.kill()
            process.wait(30)
        for pid in supervised_ever(service):  # nothing left behind, whatever happened
            with contextlib.suppress(OSError):
                if alive(pid) and b"spawn_main" in Path(f"/proc/{pid}/cmdline").read_bytes():
                    os.kill(pid, signal.SIGKILL)


def ready(service: Service) -> bool:
    if service.process.poll() is not None:
        raise RuntimeError(f"the service exited with {service.process.returncode}:\n{service.output}")
    try:
        return httpx.get(f"{service.base_url}/ready", timeout=2).status_code == 200
    except httpx.TransportError:
        return False


def wait_until(condition: Callable[[], bool], timeout_s: float, explain: Callable[[], object] = str) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        if time.monotonic() > deadline:
            raise TimeoutError(f"condition not met in {timeout_s} s: {explain()}")
        time.sleep(0.05)


# -- processes and sockets, from /proc -----------------------------------------------------------------------


def supervised(supervisor: int) -> set[int]:
    """The supervisor's engine core and frontends (multiprocessing's resource tracker is a child too)."""
    try:
        children = Path(f"/proc/{supervisor}/task/{supervisor}/children").read_text().split()
    except FileNotFoundError:
        return set()
    pids = set()
    for child in children:
        try:
            if b"spawn_main" in Path(f"/proc/{child}/cmdline").read_bytes() and alive(int(child)):
                pids.add(int(child))
        except FileNotFoundError:
            pass
    return pids


def supervised_ever(service: Service) -> set[int]:
    return {int(p) for p in re.findall(r"(?:engine core|frontend \d+): pid (\d+)", service.output)}


def alive(pid: int) -> bool:
    """Running, stopped or sleeping; not gone, not a zombie waiting for its parent."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except (FileNotFoundError, ProcessLookupError):
        return False
    return stat.rsplit(")", 1)[1].split()[0] not in ("Z", "X")


def socket_inodes(pid: int) -> set[str]:
    inodes: set[str] = set()
    try:
        fds = list(Path(f"/proc/{pid}/fd").iterdir())
    except (FileNotFoundError, PermissionError):
        return inodes
    for fd in fds:
        try:
            target = os.readlink(fd)
        except OSError:  # closed meanwhile
            continue
        if target.startswith("socket:["):
            inodes.add(target[len("socket:[") : -1])
    return inodes


def tcp_sockets() -> Iterator[tuple[int, int, str, str]]:
    """(local port, remote port, state, inode) of every TCP socket (state 0A: listening, 01: established)."""
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        for line in Path(table).read_text().splitlines()[1:]:
            fields = line.split()
            local, remote = (int(a.rsplit(":", 1)[1], 16) for a in fields[1:3])
            yield local, remote, fields[3], fields[9]


def listening(pid: int, port: int) -> bool:
    """Whether process `pid` has a socket listening on `port`."""
    inodes = socket_inodes(pid)
    return any(
        local == port and state == "0A" and inode in inodes for local, _, state, inode in tcp_sockets()
    )


def accepted_connections(pid: int, port: int) -> int:
    """Established TCP connections to `port` that process `pid` has accepted (its socket fds)."""
    inodes = socket_inodes(pid)
    return sum(
        local == port and state == "01" and inode in inodes for local, _, state, inode in tcp_sockets()
    )


def acceptor(client: socket.socket, port: int, pids: set[int], timeout_s: float = 30) -> int:
    """Which of `pids` accepted this client connection (the kernel picks among SO_REUSEPORT listeners)."""
    client_port = client.getsockname()[1]
    deadline = time.monotonic() + timeout_s
    while True:
        inodes = {
            inode
            for local, remote, state, inode in tcp_sockets()
            if local == port and remote == client_port and state == "01" and inode != "0"
        }
        owners = [pid for pid in pids if inodes & socket_inodes(pid)]
        if owners:
            return owners[0]
        if time.monotonic() > deadline:
            raise TimeoutError(f"no process of {pids} accepted the connection from port {client_port}")
        time.sleep(0.02)


@dataclass
class Link:
    """One HTTP/1.1 connection that a known frontend accepted, so a test knows which frontend answers."""

    pid: int
    sock: socket.socket

    def request(
        self, method: str, path: str, body: object = None, headers: dict[str, str] | None = None
    ) -> Answer:
        host, port = self.sock.getpeername()[:2]
        connection = http.client.HTTPConnection(host, port, timeout=60)
        connection.sock = self.sock  # already connected: http.client uses it as is (and keeps it alive)
        sent = dict(headers or {})
        content = None
        if body is not None:
            content = json.dumps(body).encode()
            sent["content-type"] = "application/json"
        connection.request(method, path, body=content, headers=sent)
        response = connection.getresponse()
        data = response.read()
        return Answer(response.status, {k.lower(): v for k, v in response.getheaders()}, data)

    def close(self) -> None:
        self.sock.close()


@dataclass(frozen=True)
class Answer:
    status: int
    headers: dict[str, str]
    body: bytes

    def json(self) -> Any:
        return json.loads(self.body)


def connections_to(port: int, pids: set[int], each: int) -> list[Link]:
    """`each` connections accepted by every process of `pids`, grouped by process: connections are opened
    until the kernel has handed enough to each (the others are closed)."""
    chosen: dict[int, list[Link]] = {pid: [] for pid in pids}
    for _ in range(100 * each * len(pids)):
        if all(len(c) >= each for c in chosen.values()):
            return [link for links in chosen.values() for link in links]
        client = socket.create_connection(("127.0.0.1", port), timeout=60)
        owner = acceptor(client, port, pids)
        if len(chosen[owner]) < each:
            chosen[owner].append(Link(owner, client))
        else:
            client.close()
    raise AssertionError(f"connections did not reach every process: {chosen}")


def readiness(port: int, frontends: set[int]) -> list[int]:
    """What /ready answers on each frontend (asked on a connection each one accepted)."""
    answers = []
    for link in connections_to(port, frontends, 1):
        answers.append(link.request("GET", "/ready").status)
        link.close()
    return answers


def all_ready(port: int, frontends: set[int]) -> bool:
    return readiness(port, frontends) == [200] * len(frontends)


# -- requests and metrics ------------------------------------------------------------------------------------


def classify(base_url: str) -> int:
    return httpx.post(f"{base_url}/v1/classify", json={"inputs": "a fine film"}, timeout=60).status_code


def metric(text: str, name: str, *labels: str) -> float:
    """The sum of a metric's series that carry every one of `labels` (e.g. 'status="200"')."""
    total = 0.0
    for line in text.splitlines():
        if (line.startswith(f"{name}{{") or line.startswith(f"{name} ")) and all(x in line for x in labels):
            total += float(line.split()[-1])
    return total


def classified(base_url: str) -> float:
    """Successful classifications so far, as one scrape of whichever frontend answers reports them."""
    text = httpx.get(f"{base_url}/metrics", timeout=60).text  # a new connection: any frontend may answer
    return metric(text, "distilserve_requests_total", 'task="text-classification"', 'status="200"')


# -- one service shared by the tests that leave it running ---------------------------------------------------


@pytest.fixture(scope="module")
def service(tiny_repository: Path) -> Iterator[Service]:
    env = {"DISTILSERVE_FRONTENDS": str(FRONTENDS), "DISTILSERVE_WORKER_TIMEOUT_S": str(HUNG_AFTER_S)}
    with serving(tiny_repository, env) as running:
        running.wait_for_roles(lambda core, frontends: len(frontends) == FRONTENDS)
        yield running
        assert running.stop() == 0, running.output
        assert not {pid for pid in supervised_ever(running) if alive(pid)}


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
