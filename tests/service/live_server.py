"""`python -m service` in a subprocess on a free 127.0.0.1 port, for tests that need a real uvicorn."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import httpx


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@dataclass
class LiveServer:
    base_url: str
    process: subprocess.Popen[str]
    output: str = ""

    def stop(self) -> int:
        """SIGTERM, then wait: the exit code (uvicorn re-raises the signal after a graceful shutdown)."""
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
        self.output, _ = self.process.communicate(timeout=60)
        return self.process.returncode


@contextmanager
def live_server(
    repository: Path, env: dict[str, str] | None = None, ready_timeout_s: float = 90
) -> Iterator[LiveServer]:
    port = free_port()
    command = [sys.executable, "-m", "service", "--port", str(port), "--model-repository", str(repository)]
    process = subprocess.Popen(
        command,
        env={**os.environ, **(env or {})},
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    server = LiveServer(f"http://127.0.0.1:{port}", process)
    try:
        deadline = time.monotonic() + ready_timeout_s
        while True:
            if process.poll() is not None:
                raise RuntimeError(
                    f"the server exited early:\n{process.stdout.read() if process.stdout else ''}"
                )
            try:
                if httpx.get(f"{server.base_url}/ready", timeout=1).status_code == 200:
                    break
            except httpx.TransportError:
                pass
            if time.monotonic() > deadline:
                raise TimeoutError("the server did not become ready")
            time.sleep(0.2)
        yield server
    finally:
        if process.poll() is None:
            server.stop()
