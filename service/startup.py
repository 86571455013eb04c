"""Where a process's start-up time goes: imports, the repository (reading manifests, checksums), ONNX Runtime
sessions, warm-up. Logged once ready and kept as `distilserve_startup_seconds{role, phase}`, so a cold start
is measured where it happens (`python -m benchmarks.cold_start` reads it back)."""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Iterator
from contextlib import contextmanager

log = logging.getLogger(__name__)


def since_process_start_s() -> float | None:
    """Seconds since the kernel started this process (Linux /proc); None elsewhere. Measured at the start of
    the first phase, it is what the interpreter and the imports took."""
    try:
        with open("/proc/self/stat", encoding="ascii") as f:
            started_ticks = int(f.read().rsplit(")", 1)[1].split()[19])
        with open("/proc/uptime", encoding="ascii") as f:
            uptime = float(f.read().split()[0])
    except (OSError, ValueError, IndexError):
        return None
    return max(0.0, uptime - started_ticks / os.sysconf("SC_CLK_TCK"))


class StartupClock:
    """Named phases of one process's start-up, in order."""

    def __init__(self, role: str) -> None:
        self.role = role
        self.phases: dict[str, float] = {}
        imports = since_process_start_s()
        if imports is not None:
            self.phases["imports"] = imports

    @contextmanager
    def phase(self, name: str) -> Iterator[None]:
        started = time.perf_counter()
        try:
            yield
        finally:
            self.phases[name] = self.phases.get(name, 0.0) + time.perf_counter() - started

    def report(self, gauge: object | None = None) -> None:
        """One log line, and each phase into `gauge` (labels role, phase) when given."""
        total = sum(self.phases.values())
        parts = ", ".join(f"{name} {seconds:.2f} s" for name, seconds in self.phases.items())
        log.info("%s start-up: %.2f s (%s)", self.role, total, parts)
        if gauge is not None:
            for name, seconds in self.phases.items():
                gauge.labels(self.role, name).set(seconds)  # type: ignore[attr-defined]
