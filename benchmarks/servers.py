"""The servers a benchmark starts: the service (or a server taking its flags), the naive baseline.

BENCH_SERVER_CPUS (a `taskset -c` list, e.g. `0`) pins the service and all its processes to those cores; run
the benchmark itself under `taskset -c` on the others, and the load generator no longer takes the server's
CPU (on a 2-core machine: one core each)."""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

import httpx

from loadtests.run import free_port


def wait_ready(url: str, process: subprocess.Popen[bytes], timeout_s: float = 180) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise RuntimeError(f"{url}: the server exited with {process.returncode}")
        try:
            if httpx.get(url, timeout=1).status_code == 200:
                return
        except httpx.TransportError:
            pass
        time.sleep(0.3)
    raise TimeoutError(f"{url} did not become ready")


SERVER_PIDS: dict[str, int] = {}  # base URL -> the server's process, for its CPU per request


@contextmanager
def running(
    command: list[str],
    wait: Callable[[subprocess.Popen[bytes]], None],
    env: dict[str, str],
    cwd: Path | None = None,
) -> Iterator[subprocess.Popen[bytes]]:
    """Run a server (from `cwd`'s tree, when given) until the block ends; `wait` returns once it answers,
    else its log is in the error."""
    with tempfile.TemporaryFile() as log:
        if cwd is not None:  # that tree's packages, not the installed ones
            env = {**env, "PYTHONPATH": str(cwd)}
        process = subprocess.Popen(
            command, env={**os.environ, **env}, stdout=log, stderr=subprocess.STDOUT, cwd=cwd
        )
        try:
            try:
                wait(process)
            except (RuntimeError, TimeoutError) as e:
                log.seek(0)
                tail = log.read().decode(errors="replace")[-4000:]
                raise RuntimeError(f"{' '.join(command[1:4])}: {e}\n{tail}") from e
            yield process
        finally:
            process.terminate()
            process.wait(timeout=60)


@contextmanager
def serve(
    repository: Path,
    env: dict[str, str],
    module: str = "service",
    ready: str = "/ready",
    tree: Path | None = None,
) -> Iterator[str]:
    """The service (or `module`, a server taking the service's flags; from another checkout's `tree`)
    until the block ends; its base URL."""
    port = free_port()
    base = f"http://127.0.0.1:{port}"
    command = [
        sys.executable,
        "-m",
        module,
        "--port",
        str(port),
        "--model-repository",
        str(repository.resolve()),
    ]
    if os.environ.get("BENCH_SERVER_CPUS"):
        command = ["taskset", "-c", os.environ["BENCH_SERVER_CPUS"], *command]
    with running(
        command,
        lambda process: wait_ready(f"{base}{ready}", process),
        {"DISTILSERVE_LOG_LEVEL": "warning", **env},
        cwd=tree,
    ) as process:
        SERVER_PIDS[base] = process.pid
        try:
            yield base
        finally:
            SERVER_PIDS.pop(base, None)


@contextmanager
def serve_naive(model_dir: Path, device: str) -> Iterator[str]:
    port = free_port()
    base = f"http://127.0.0.1:{port}"
    command = [sys.executable, "-m", "benchmarks.naive_server", str(model_dir), "--port", str(port)]
    command += ["--device", "cuda" if device == "gpu" else "cpu"]

    def wait(process: subprocess.Popen[bytes]) -> None:
        deadline = time.monotonic() + 120
        while True:
            try:
                httpx.post(f"{base}/v1/classify", json={"inputs": "warm up"}, timeout=5)
                return
            except httpx.TransportError:
                if time.monotonic() > deadline or process.poll() is not None:
                    raise RuntimeError("the naive server did not start") from None
                time.sleep(0.5)

    with running(command, wait, {}):
        yield base
