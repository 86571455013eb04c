"""`python -m service` under its supervisor in a subprocess, and what tests read of it: its log while it runs,
which processes it supervises (from /proc), their sockets and connections, readiness and metrics."""

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

from tests.service.live_server import free_port

ROOT = Path(__file__).resolve().parents[2]


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
