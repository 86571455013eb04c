"""`python -m service` in a subprocess on a free 127.0.0.1 port, for tests that need a real uvicorn."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

import httpx


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@dataclass
class LiveServer:
    """The server's output is read as it comes: a pipe nobody reads fills up (64 KiB of access lines under
    load) and then every log write in the server blocks."""

    base_url: str
    process: subprocess.Popen[str]
    _lines: list[str] = field(default_factory=list)
    _reader: threading.Thread | None = None

    def read_output(self) -> None:
        def read() -> None:
            assert self.process.stdout is not None
            for line in self.process.stdout:
                self._lines.append(line)

        self._reader = threading.Thread(target=read, name="live-server-output", daemon=True)
        self._reader.start()

    @property
    def output(self) -> str:
        return "".join(self._lines)

    def stop(self) -> int:
        """SIGTERM, then wait: the exit code (uvicorn re-raises the signal after a graceful shutdown)."""
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
        self.process.wait(timeout=60)
        if self._reader is not None:
            self._reader.join(timeout=10)
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
    server.read_output()
    try:
        deadline = time.monotonic() + ready_timeout_s
        while True:
            if process.poll() is not None:
                server.stop()
                raise RuntimeError(f"the server exited early:\n{server.output}")
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
