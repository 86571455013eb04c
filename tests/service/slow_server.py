"""`python -m tests.service.slow_server [flags]`: the real entry point, with classification engine calls
slowed by SLOW_ENGINE_S seconds, so a test can be sure requests are in flight when SIGTERM arrives;
`running_slow_server` starts it for a test."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

import httpx
import numpy as np

from service.__main__ import main
from service.engine import Engine
from service.repository import ModelVersion
from service.runtime import ort_engine_factory
from service.settings import Settings


class SlowEngine:
    def __init__(self, inner: Engine, delay_s: float) -> None:
        self.inner = inner
        self.delay_s = delay_s
        self.provider = inner.provider
        self.input_names = inner.input_names

    def run(self, feeds: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        time.sleep(self.delay_s)
        return self.inner.run(feeds)


def slow_factory(version: ModelVersion, variant: str, settings: Settings) -> Engine:
    engine = ort_engine_factory(version, variant, settings)
    if version.manifest.task != "text-classification":
        return engine
    return SlowEngine(engine, float(os.environ.get("SLOW_ENGINE_S", "0.5")))


ROOT = Path(__file__).resolve().parents[2]


@contextmanager
def running_slow_server(repository: Path, env: dict[str, str]) -> Iterator[tuple[str, subprocess.Popen[str]]]:
    """This module's server on a free 127.0.0.1 port (`env` on top of ours; SLOW_ENGINE_S among it), once
    ready: its base URL and process, killed afterwards if still running."""
    from tests.service.live_server import free_port

    port = free_port()
    command = [sys.executable, "-m", "tests.service.slow_server", "--port", str(port)]
    command += ["--model-repository", str(repository), "--warmup", "false"]
    process = subprocess.Popen(
        command,
        cwd=ROOT,
        env={**os.environ, **env},
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    base = f"http://127.0.0.1:{port}"
    try:
        wait_for(lambda: _ready(base, process), timeout_s=60)
        yield base, process
    finally:
        if process.poll() is None:
            process.kill()
            process.communicate()


def _ready(base: str, process: subprocess.Popen[str]) -> bool:
    if process.poll() is not None:
        raise RuntimeError(f"the server exited early:\n{process.communicate()[0]}")
    try:
        return httpx.get(f"{base}/ready", timeout=1).status_code == 200
    except httpx.TransportError:
        return False


def wait_for(condition: Callable[[], bool], timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        if time.monotonic() > deadline:
            raise TimeoutError("condition not met in time")
        time.sleep(0.05)


if __name__ == "__main__":
    main(engine_factory=slow_factory)
