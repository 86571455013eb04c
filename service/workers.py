"""Several server processes on one port (`DISTILSERVE_WORKERS`), and the small supervisor in front of them.

One Python event loop spends ~0.7 ms of CPU on every request (HTTP, validation, tokenizing, the response), so
one process cannot keep a GPU or many cores busy. Each worker is the whole single-process server (its models,
batchers, event loop and drain) on its share of the cores, listening on a socket of its own bound with
SO_REUSEPORT: the kernel spreads new connections evenly over the listening ones. (One shared socket lets
whichever worker wakes first accept a burst of them: 64 connections opened at once all went to one worker.)
uvicorn listens only once the app has started, so a worker still loading its models, or a replacement for
one that died, gets no connections until it can answer them. The supervisor holds the port (bound, never
listening), keeps prometheus_client's multiprocess files so any worker's /metrics reports the sum, starts a
worker again when one dies (later and later while it keeps dying young), stops everything when one cannot
start, kills and replaces one whose event loop stopped ticking (hung: alive, answering nobody), and on
SIGTERM or Ctrl-C has every worker drain as a single server would.
"""

from __future__ import annotations

import asyncio
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
from dataclasses import dataclass, field
from multiprocessing.process import BaseProcess
from multiprocessing.synchronize import Event, Semaphore
from types import FrameType

from prometheus_client import multiprocess

from service.app import StartupError, create_app
from service.logs import configure_logging
from service.metrics import clear_multiprocess_dir, multiprocess_dir
from service.runtime import EngineFactory
from service.server import STARTUP_FAILURE, serve
from service.settings import Settings

log = logging.getLogger(__name__)

METRICS_DIR_ENV = "PROMETHEUS_MULTIPROC_DIR"
STOP_MARGIN_S = 30.0  # past the grace period: closing the models and the interpreter, before SIGKILL
SETTLED_S = 60.0  # a worker that dies sooner after its start counts towards the restart backoff
MAX_BACKOFF_S = 30.0
HEARTBEAT_S = 1.0


def reuseport_socket(host: str, port: int) -> socket.socket:
    """A TCP socket bound to host:port beside others (SO_REUSEPORT), not listening yet."""
    if not hasattr(socket, "SO_REUSEPORT"):
        raise OSError("several workers need SO_REUSEPORT (Linux); run one worker on this system")
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
    """Workers report when loaded; none listens before all have (at start-up: a load balancer's first
    connections, or wrk's, would otherwise all land on the fastest worker and stay there)."""

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
    """A worker's event loop stamps `last` (time.monotonic, one clock for every process) every second; the
    supervisor reads it. A loop that stops stamping is stuck (a blocking call, a deadlock, a stopped process):
    its worker may be alive, but answers nobody. 0 until the worker has loaded its models."""

    last: ctypes.c_double  # shared memory without a lock: a worker stopped while holding one would hang us
    _task: asyncio.Task[None] | None = field(default=None, init=False, repr=False)

    def start(self) -> None:
        self._task = asyncio.get_running_loop().create_task(self._beat(), name="heartbeat")

    async def _beat(self) -> None:
        while True:
            self.last.value = time.monotonic()
            await asyncio.sleep(HEARTBEAT_S)

    def silent_for(self, now: float) -> float:
        """Seconds since the last stamp; 0 before the first."""
        last = self.last.value
        return now - last if last else 0.0


def run_worker(
    settings: Settings, engine_factory: EngineFactory, gate: StartGate, heartbeat: Heartbeat, parent: int
) -> None:
    """A worker's life, in a fresh interpreter: the single-process server on a socket of its own."""
    os.setpgrp()  # Ctrl-C reaches the supervisor alone, which forwards it once (twice would skip the drain)
    configure_logging(settings.log_level, settings.log_format)
    threading.Thread(target=_exit_when_orphaned, args=(parent,), daemon=True, name="orphan-watch").start()

    async def loaded() -> None:
        await gate.report_and_wait(parent)
        heartbeat.start()

    try:
        sock = reuseport_socket(settings.host, settings.port)
        app = create_app(settings, engine_factory, loaded=loaded)
    except (OSError, StartupError) as e:
        log.error("distilserve: %s", e)
        sys.exit(STARTUP_FAILURE)
    serve(app, settings, sockets=[sock])


def _exit_when_orphaned(parent: int) -> None:
    """A supervisor killed outright cannot stop its workers: they notice and drain on their own."""
    while os.getppid() == parent:
        time.sleep(1.0)
    log.warning("the supervisor (pid %d) is gone; draining", parent)
    os.kill(os.getpid(), signal.SIGTERM)


class Supervisor:
    """Starts `settings.workers` workers, keeps them running, and stops them on a signal."""

    def __init__(self, settings: Settings, engine_factory: EngineFactory) -> None:
        self.settings = settings
        self.engine_factory = engine_factory
        self._spawn = multiprocessing.get_context("spawn")  # no fork: ONNX Runtime threads do not survive one
        self._gate = StartGate(self._spawn.Semaphore(0), self._spawn.Event())
        self._loaded = 0
        self._started_at: dict[int, float] = {}
        self._quick_deaths: dict[int, int] = {}
        self._restart_at: dict[int, float] = {}  # worker index -> when its replacement starts
        self._heartbeats: dict[int, Heartbeat] = {}
        self._signals: list[int] = []
        self._wake = threading.Event()
        self.workers: list[BaseProcess] = []

    def run(self) -> int:
        """Until a signal (0) or a worker that cannot start (STARTUP_FAILURE): the process's exit code."""
        try:
            held = reuseport_socket(self.settings.host, self.settings.port)
        except OSError as e:
            log.error("distilserve: cannot bind %s:%d: %s", self.settings.host, self.settings.port, e)
            return STARTUP_FAILURE
        port = held.getsockname()[1]  # port 0 resolves here, once, for every worker
        self.settings = self.settings.model_copy(update={"port": port})
        metrics_dir, owned = _metrics_dir()
        os.environ[METRICS_DIR_ENV] = metrics_dir  # the workers inherit it and import prometheus_client after
        for sig in (signal.SIGTERM, signal.SIGINT):
            signal.signal(sig, self._on_signal)
        try:
            self.workers = [self._start(i) for i in range(self.settings.workers)]
            log.info(
                "supervisor (pid %d): %d workers on http://%s:%d",
                os.getpid(),
                len(self.workers),
                self.settings.host,
                port,
            )
            code = self._watch(metrics_dir)
        finally:
            self._stop_all()
            held.close()
            if owned:
                shutil.rmtree(metrics_dir, ignore_errors=True)
        return code

    def _on_signal(self, sig: int, frame: FrameType | None) -> None:
        self._signals.append(sig)
        self._wake.set()

    def _start(self, index: int) -> BaseProcess:
        heartbeat = self._heartbeats[index] = Heartbeat(self._spawn.RawValue(ctypes.c_double, 0.0))
        process = self._spawn.Process(
            target=run_worker,
            args=(self.settings, self.engine_factory, self._gate, heartbeat, os.getpid()),
            name=f"distilserve-worker-{index}",
        )
        process.start()
        self._started_at[index] = time.monotonic()
        log.info("worker %d: pid %s", index, process.pid)
        return process

    def _watch(self, metrics_dir: str) -> int:
        while not self._signals:
            self._wake.wait(0.5)
            self._open_when_all_loaded()
            for index, process in enumerate(self.workers):
                if self._signals:
                    break
                if index in self._restart_at:  # dead, its replacement due later
                    if time.monotonic() >= self._restart_at[index]:
                        del self._restart_at[index]
                        self.workers[index] = self._start(index)
                    continue
                if process.is_alive():
                    self._kill_if_hung(index, process)
                    continue
                process.join()
                _forget(process, metrics_dir)
                if process.exitcode == STARTUP_FAILURE:
                    log.error("worker %d could not start; stopping the others", index)
                    return STARTUP_FAILURE
                self._restart_at[index] = time.monotonic() + self._backoff(index)
                log.warning(
                    "worker %d (pid %s) exited with %s; starting another in %.1f s",
                    index,
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
            "worker %d (pid %s): its event loop has not ticked for %.0f s (timeout %g s); killing it",
            index,
            process.pid,
            silent,
            self.settings.worker_timeout_s,
        )
        heartbeat.last.value = 0.0  # once
        process.kill()

    def _backoff(self, index: int) -> float:
        """0 for a worker that had been running a while; 1, 2, 4 ... 30 s for one that keeps dying young
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
        if self._loaded >= len(self.workers):
            self._gate.go.set()
            log.info("all %d workers are ready; listening", len(self.workers))

    def _stop_all(self) -> None:
        """SIGTERM to every worker (each drains within the grace period), again on a second signal, then
        SIGKILL for any still there past the grace period and a margin."""
        self._gate.go.set()  # a worker still waiting for its siblings goes on, then drains
        forwarded = 0
        deadline = time.monotonic() + self.settings.shutdown_grace_s + STOP_MARGIN_S
        while any(p.is_alive() for p in self.workers):
            if forwarded < min(2, max(1, len(self._signals))):
                for process in self.workers:
                    if process.is_alive() and process.pid is not None:
                        os.kill(process.pid, signal.SIGTERM)
                forwarded += 1
            if time.monotonic() > deadline:
                log.error("workers still running past the grace period; killing them")
                for process in self.workers:
                    process.kill()
                break
            self._wake.clear()
            self._wake.wait(0.1)
        for process in self.workers:
            process.join()


def _metrics_dir() -> tuple[str, bool]:
    """The multiprocess metrics directory, emptied (files of an earlier run would add up); True when ours."""
    given = multiprocess_dir()
    if given is None:
        return tempfile.mkdtemp(prefix="distilserve-metrics-"), True
    clear_multiprocess_dir()
    return given, False


def _forget(process: BaseProcess, metrics_dir: str) -> None:
    """A dead worker's gauges no longer count (its counters and histograms still do)."""
    if process.pid is not None:
        multiprocess.mark_process_dead(process.pid, metrics_dir)


def supervise(settings: Settings, engine_factory: EngineFactory) -> int:
    return Supervisor(settings, engine_factory).run()
