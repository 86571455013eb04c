"""Live agreement replayed: a served student answers requests with DISTILSERVE_SHADOW_RATE=1 and its teacher
checks every answer, one request at a time (each sent once the teacher has checked the one before, so no
client work competes with the checks); then the same server under wrk load, where checks must give way.
benchmarks.cascade (classification, QA) and benchmarks.embeddings use it."""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
from rich.console import Console

from benchmarks.servers import serve
from benchmarks.wrk_load import LoadResult, load, metric_totals
from common.progress import ProgressLog

console = Console(stderr=True)


@dataclass
class Live:
    """Answers checked by the teacher at shadow rate 1, and what a load with shadows on left of them."""

    compared: float
    agreed: float  # a count, or an embedding student's sum of cosines
    dropped: float
    offline: float | None  # the export-time figure the manifest carries
    under_load: LoadResult | None = None  # `connections` clients, shadow rate 1: what shedding leaves
    checked_under_load: float = 0.0  # shadow checks done / dropped during that load
    dropped_under_load: float = 0.0

    @property
    def agreement(self) -> float:
        return self.agreed / self.compared if self.compared else float("nan")


def replay_with_shadows(
    repository: Path,
    path: str,
    requests: Sequence[tuple[dict[str, Any], int]],
    bodies: list[str],
    offline: float | None,
    connections: int,
    seconds: int,
) -> Live:
    """A server with DISTILSERVE_SHADOW_RATE=1 and the cascade off answers `requests` (each a body and its
    inputs) at `path`, one at a time, the teacher checking each; then wrk sends `bodies` (one input each)
    at `connections` for `seconds`."""
    env = {"DISTILSERVE_SHADOW_RATE": "1.0", "DISTILSERVE_CASCADE": "off"}
    with serve(repository, env) as base:

        def counts() -> tuple[float, float, float]:
            totals = metric_totals(base)
            compared, agreed, dropped = (
                totals.get(f"distilserve_shadow_{n}_total", 0.0) for n in ("compared", "agreed", "dropped")
            )
            return compared, agreed, dropped

        sent = 0
        total = sum(n for _, n in requests)
        with (
            ProgressLog.beside(console, "shadow replay", total, unit="inputs") as progress,
            httpx.Client(base_url=base, timeout=300) as client,
        ):
            for body, inputs in requests:
                client.post(path, json=body).raise_for_status()
                sent += inputs
                deadline = time.monotonic() + 30
                while sum(counts()[::2]) < sent and time.monotonic() < deadline:
                    time.sleep(0.01)
                progress.update(advance=inputs)
        compared, agreed, dropped = counts()
        under_load = load("student, shadow rate 1", base, path, bodies, connections, seconds)
        after = counts()
    return Live(compared, agreed, dropped, offline, under_load, after[0] - compared, after[2] - dropped)
