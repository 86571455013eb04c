"""`python -m service`: one engine core process and `DISTILSERVE_FRONTENDS` HTTP frontends, supervised.

The engine core (service.core) loads every model once and batches every frontend's requests together; the
frontends do HTTP, validation, tokenizing and post-processing, and reach the core over a ZMQ socket in a
private directory. One Python event loop spends ~0.5-1.4 ms of CPU on every request, so one process cannot
keep a GPU or many cores busy, and copying the whole server per core would load every model N times and
split every batch N ways: the frontends scale the HTTP side alone.

Each frontend listens on a socket of its own bound with SO_REUSEPORT: the kernel spreads new connections
evenly over the listening ones. (One shared socket lets whichever process wakes first accept a burst of
them: 64 connections opened at once all went to one.) A frontend listens only once the core has told it
what is served, and none before all have, so the first burst of connections reaches all of them. Each
serves the v2 gRPC service the same way on DISTILSERVE_GRPC_PORT (service.api.grpc_v2). The
supervisor holds the ports (bound, never listening), keeps prometheus_client's multiprocess files so any
frontend's /metrics reports every process, starts a process again when one dies (later and later while it
keeps dying young), stops everything when the core cannot start, kills and replaces a process whose event
loop stopped ticking (hung: alive, answering nobody), and on SIGTERM or Ctrl-C drains the frontends first
(they finish what they admitted, which needs the core) and then the core.
"""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import logging
import multiprocessing
import os
import shutil
import signal
import socket
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from multiprocessing.process import BaseProcess
from multiprocessing.synchronize import Event, Semaphore
from types import FrameType

from prometheus_client import multiprocess

from service.app import create_app
from service.core import run_core
from service.engine import name_this_thread
from service.engine_plan import EngineFactory
from service.logs import configure_logging, stop_writing
from service.metrics import clear_multiprocess_dir, multiprocess_dir
from service.runtime import StartupError
from service.server import STARTUP_FAILURE, serve
from service.settings import Settings, frontend_count

log = logging.getLogger(__name__)

METRICS_DIR_ENV = "PROMETHEUS_MULTIPROC_DIR"
STOP_MARGIN_S = 30.0  # past the grace period: closing the models and the interpreter, before SIGKILL
SETTLED_S = 60.0  # a worker that dies sooner after its start counts towards the restart backoff
MAX_BACKOFF_S = 30.0
HEARTBEAT_S = 1.0


def reuseport_socket(host: str, port: int) -> socket.socket:
    """A TCP socket bound to host:port beside others (SO_REUSEPORT), not listening yet."""
    if not hasattr(socket, "SO_REUSEPORT"):
        raise OSError("the frontends share their port with SO_REUSEPORT (Linux)")
    family, kind, proto, _, address = socket.getaddrinfo(
        host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE
    )[0]
    sock = socket.socket(family, kind, proto)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
    sock.bind(address)
    return sock


@dataclass(frozen=True)
class StartGate:
    """Frontends report when they know what is served; none listens before all have (at start-up: a load
    balancer's first connections, or wrk's, would otherwise all land on the fastest one and stay there)."""

    loaded: Semaphore
    go: Event

    async def report_and_wait(self, parent: int) -> None:
        self.loaded.release()
        await asyncio.to_thread(self._wait, parent)

    def _wait(self, parent: int) -> None:
        while not self.go.wait(1.0) and os.getppid() == parent:
            pass


@dataclass
class Heartbeat:
    """A process's event loop stamps `last` (time.monotonic, one clock for every process) every second; the
    supervisor reads it. A loop that stops stamping is stuck (a blocking call, a deadlock, a stopped process):
    the process may be alive, but answers nobody. 0 until it has started serving."""

    last: ctypes.c_double  # shared memory without a lock: a worker stopped while holding one would hang us
    _task: asyncio.Task[None] | None = field(default=None, init=False, repr=False)

    def start(self) -> None:
        self._task = asyncio.get_running_loop().create_task(self._beat(), name="heartbeat")

    def stamp(self) -> None:
        self.last.value = time.monotonic()

    async def _beat(self) -> None:
        while True:
            self.last.value = time.monotonic()
            await asyncio.sleep(HEARTBEAT_S)

    def silent_for(self, now: float) -> float:
        """Seconds since the last stamp; 0 before the first."""
        last = self.last.value
        return now - last if last else 0.0


def run_frontend(
    settings: Settings, engine_factory: EngineFactory, gate: StartGate, heartbeat: Heartbeat, parent: int
) -> None:
    """A frontend's life, in a fresh interpreter: the HTTP server on a socket of its own, its engine the
    core at `settings.engine_address`."""
    _child_process(settings, parent, "ds-frontend")

    async def loaded() -> None:
        await gate.report_and_wait(parent)
        heartbeat.start()

    with _last_lines_written():
        try:
            sock = reuseport_socket(settings.host, settings.port)
            app = create_app(settings, engine_factory, loaded=loaded, grpc=True)
        except (OSError, StartupError) as e:
            log.error("distilserve: %s", e)
            sys.exit(STARTUP_FAILURE)
        serve(app, settings, sockets=[sock])


def run_engine_core(
    settings: Settings, engine_factory: EngineFactory, heartbeat: Heartbeat, parent: int
) -> None:
    """The engine core's life, in a fresh interpreter."""
    _child_process(settings, parent, "ds-engine-core")
    with _last_lines_written():
        try:
            asyncio.run(run_core(settings, engine_factory, on_tick=heartbeat.stamp))
        except StartupError as e:
            log.error("distilserve: %s", e)
            sys.exit(STARTUP_FAILURE)


@contextlib.contextmanager
def _last_lines_written() -> Iterator[None]:
    """A child process leaves by os._exit (multiprocessing), which runs no atexit: the log lines still
    queued (service.logs) are written here, on every way out."""
    try:
        yield
    finally:
        stop_writing()


def _child_process(settings: Settings, parent: int, name: str) -> None:
    name_this_thread(name)  # the process's name in ps and top, and the threads it starts
    os.setpgrp()  # Ctrl-C reaches the supervisor alone, which forwards it once (twice would skip the drain)
    configure_logging(settings.log_level, settings.log_format)
    threading.Thread(target=_exit_when_orphaned, args=(parent,), daemon=True, name="orphan-watch").start()


def _exit_when_orphaned(parent: int) -> None:
    """A supervisor killed outright cannot stop its workers: they notice and drain on their own."""
    while os.getppid() == parent:
        time.sleep(1.0)
    log.warning("the supervisor (pid %d) is gone; draining", parent)
    os.kill(os.getpid(), signal.SIGTERM)


CORE = 0  # the engine core's index among the supervised processes; frontends are 1..N


class Supervisor:
    """Starts the engine core and the frontends, keeps them running, and stops them on a signal."""

    def __init__(self, settings: Settings, engine_factory: EngineFactory) -> None:
        self.settings = settings
        self.engine_factory = engine_factory
        self._spawn = multiprocessing.get_context("spawn")  # no fork: ONNX Runtime threads do not survive one
        self._gate = StartGate(self._spawn.Semaphore(0), self._spawn.Event())
        self._loaded = 0
        self._started_at: dict[int, float] = {}
        self._quick_deaths: dict[int, int] = {}
        self._restart_at: dict[int, float] = {}  # process index -> when its replacement starts
        self._heartbeats: dict[int, Heartbeat] = {}
        self._signals: list[int] = []
        self._wake = threading.Event()
        self.processes: list[BaseProcess] = []  # [engine core, frontend 1, ..., frontend N]

    def run(self) -> int:
        """Until a signal (0) or a process that cannot start (STARTUP_FAILURE): the process's exit code."""
        try:
            held = reuseport_socket(self.settings.host, self.settings.port)
        except OSError as e:
            log.error("distilserve: cannot bind %s:%d: %s", self.settings.host, self.settings.port, e)
            return STARTUP_FAILURE
        try:  # the frontends' gRPC port (service.api.grpc_v2), held the same way
            held_grpc = (
                reuseport_socket(self.settings.host, self.settings.grpc_port)
                if self.settings.grpc_port
                else None
            )
        except OSError as e:
            held.close()
            log.error(
                "distilserve: cannot bind gRPC %s:%d: %s", self.settings.host, self.settings.grpc_port, e
            )
            return STARTUP_FAILURE
        port = held.getsockname()[1]  # port 0 resolves here, once, for every frontend
        sockets = tempfile.mkdtemp(prefix="distilserve-ipc-")
        address = self.settings.engine_address or f"unix:{sockets}/engine-core.sock"
        self.settings = self.settings.model_copy(update={"port": port, "engine_address": address})
        metrics_dir, owned = _metrics_dir()
        os.environ[METRICS_DIR_ENV] = (
            metrics_dir  # the children inherit it and import prometheus_client after
        )
        for sig in (signal.SIGTERM, signal.SIGINT):
            signal.signal(sig, self._on_signal)
        try:
            frontends = frontend_count(self.settings)
            self.processes = [self._start(i) for i in range(1 + frontends)]
            log.info(
                "supervisor (pid %d): an engine core and %d frontend(s) on http://%s:%d",
                os.getpid(),
                frontends,
                self.settings.host,
                port,
            )
            if self.settings.grpc_port:
                log.info(
                    "gRPC (Open Inference Protocol) on %s:%d", self.settings.host, self.settings.grpc_port
                )
            code = self._watch(metrics_dir)
        finally:
            self._stop_all()
            held.close()
            if held_grpc is not None:
                held_grpc.close()
            shutil.rmtree(sockets, ignore_errors=True)
            if owned:
                shutil.rmtree(metrics_dir, ignore_errors=True)
        return code

    def _on_signal(self, sig: int, frame: FrameType | None) -> None:
        self._signals.append(sig)
        self._wake.set()

    @staticmethod
    def _name(index: int) -> str:
        return "engine core" if index == CORE else f"frontend {index}"

    def _start(self, index: int) -> BaseProcess:
        heartbeat = self._heartbeats[index] = Heartbeat(self._spawn.RawValue(ctypes.c_double, 0.0))
        target: Callable[..., None]
        args: tuple[object, ...]
        if index == CORE:
            target, name = run_engine_core, "distilserve-engine-core"
            args = (self.settings, self.engine_factory, heartbeat, os.getpid())
        else:
            target, name = run_frontend, f"distilserve-frontend-{index}"
            args = (self.settings, self.engine_factory, self._gate, heartbeat, os.getpid())
        process = self._spawn.Process(target=target, args=args, name=name)
        process.start()
        self._started_at[index] = time.monotonic()
        log.info("%s: pid %s", self._name(index), process.pid)
        return process

    def _watch(self, metrics_dir: str) -> int:
        while not self._signals:
            self._wake.wait(0.5)
            self._open_when_all_loaded()
            for index, process in enumerate(self.processes):
                if self._signals:
                    break
                if index in self._restart_at:  # dead, its replacement due later
                    if time.monotonic() >= self._restart_at[index]:
                        del self._restart_at[index]
                        self.processes[index] = self._start(index)
                    continue
                if process.is_alive():
                    self._kill_if_hung(index, process)
                    continue
                process.join()
                _forget(process, metrics_dir)
                if process.exitcode == STARTUP_FAILURE:
                    log.error("the %s could not start; stopping the others", self._name(index))
                    return STARTUP_FAILURE
                self._restart_at[index] = time.monotonic() + self._backoff(index)
                log.warning(
                    "%s (pid %s) exited with %s; starting another in %.1f s",
                    self._name(index),
                    process.pid,
                    process.exitcode,
                    self._restart_at[index] - time.monotonic(),
                )
        return 0

    def _kill_if_hung(self, index: int, process: BaseProcess) -> None:
        """SIGKILL (SIGTERM would wait on the stuck loop to drain); the watch loop then replaces it."""
        heartbeat = self._heartbeats[index]
        silent = heartbeat.silent_for(time.monotonic())
        if silent <= self.settings.worker_timeout_s:
            return
        log.error(
            "%s (pid %s): its event loop has not ticked for %.0f s (timeout %g s); killing it",
            self._name(index),
            process.pid,
            silent,
            self.settings.worker_timeout_s,
        )
        heartbeat.last.value = 0.0  # once
        process.kill()

    def _backoff(self, index: int) -> float:
        """0 for a process that had been running a while; 1, 2, 4 ... 30 s for one that keeps dying young
        (killed while loading its models, say), so a crash loop does not reload the models twice a second."""
        lived = time.monotonic() - self._started_at.get(index, 0.0)
        self._quick_deaths[index] = self._quick_deaths.get(index, 0) + 1 if lived < SETTLED_S else 0
        deaths = self._quick_deaths[index]
        return 0.0 if deaths == 0 else min(MAX_BACKOFF_S, 2.0 ** (deaths - 1))

    def _open_when_all_loaded(self) -> None:
        if self._gate.go.is_set():
            return
        while self._gate.loaded.acquire(block=False):
            self._loaded += 1
        if self._loaded >= len(self.processes) - 1:
            self._gate.go.set()
            log.info("all %d frontends are ready; listening", len(self.processes) - 1)

    def _stop_all(self) -> None:
        """The frontends first (each drains what it admitted, which needs the core), then the core: SIGTERM,
        again on a second signal, SIGKILL for any still there past the grace period and a margin."""
        self._gate.go.set()  # a frontend still waiting for its siblings goes on, then drains
        deadline = time.monotonic() + self.settings.shutdown_grace_s + STOP_MARGIN_S
        self._stop(self.processes[CORE + 1 :], deadline)
        self._stop(self.processes[: CORE + 1], time.monotonic() + STOP_MARGIN_S)

    def _stop(self, processes: list[BaseProcess], deadline: float) -> None:
        forwarded = 0
        while any(p.is_alive() for p in processes):
            if forwarded < min(2, max(1, len(self._signals))):
                for process in processes:
                    if process.is_alive() and process.pid is not None:
                        os.kill(process.pid, signal.SIGTERM)
                forwarded += 1
            if time.monotonic() > deadline:
                log.error("still running past the grace period; killing them")
                for process in processes:
                    process.kill()
                break
            self._wake.clear()
            self._wake.wait(0.1)
        for process in processes:
            process.join()


def _metrics_dir() -> tuple[str, bool]:
    """The multiprocess metrics directory, emptied (files of an earlier run would add up); True when ours."""
    given = multiprocess_dir()
    if given is None:
        return tempfile.mkdtemp(prefix="distilserve-metrics-"), True
    clear_multiprocess_dir()
    return given, False


def _forget(process: BaseProcess, metrics_dir: str) -> None:
    """A dead process's gauges no longer count (its counters and histograms still do)."""
    if process.pid is not None:
        multiprocess.mark_process_dead(process.pid, metrics_dir)


def supervise(settings: Settings, engine_factory: EngineFactory) -> int:
    return Supervisor(settings, engine_factory).run()
