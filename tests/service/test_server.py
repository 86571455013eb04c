"""`python -m service` as a user runs it: a real uvicorn on 127.0.0.1, then SIGTERM."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def test_the_entrypoint_serves_and_stops_cleanly(classification_repository: Path) -> None:
    port = free_port()
    env = {**os.environ, "DISTILSERVE_MAX_BATCH_SIZE": "8"}
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "service",
            "--port",
            str(port),
            "--model-repository",
            str(classification_repository),
        ],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    base = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            try:
                if httpx.get(f"{base}/ready", timeout=1).status_code == 200:
                    break
            except httpx.TransportError:
                pass
            assert proc.poll() is None, proc.stdout.read() if proc.stdout else ""
            time.sleep(0.2)
        response = httpx.post(f"{base}/v1/classify", json={"inputs": ["a wonderful film", "a terrible film"]})
        assert response.status_code == 200
        assert [len(r) for r in response.json()] == [1, 1]
        assert "distilserve_requests_total" in httpx.get(f"{base}/metrics").text
    finally:
        proc.send_signal(signal.SIGTERM)
        output, _ = proc.communicate(timeout=30)
    # uvicorn shuts down gracefully, then re-raises SIGTERM so supervisors see the signal it got.
    assert proc.returncode in (0, -signal.SIGTERM), output
    assert "Application shutdown complete" in output
    assert "provider=CPUExecutionProvider" in output  # the provider in use is logged at start-up
