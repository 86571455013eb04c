"""A service whose classifier engine is gated: each engine call is written down as it begins, and a call can
be held until the test lets it go, so a test knows what is queued in the engine core and what was computed,
without depending on timing (tests/service/test_engine_core.py)."""

from __future__ import annotations

import json
import math
import os
import threading
import time
from contextlib import ExitStack
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import numpy as np

from service.engine import Engine
from service.repository import ModelVersion
from service.runtime import ort_engine_factory
from service.settings import Settings
from tests.conftest import TASK_MODEL_NAMES
from tests.service.supervised import Service, metric, serving

CLS = TASK_MODEL_NAMES["text-classification"]
GATE_ENV = "TEST_ENGINE_GATE_DIR"


# -- the gated classifier engine (runs in the engine core) ---------------------------------------------------


class GatedEngine:
    """Writes each call's batch size to `<gate>/calls` as the call begins; a call whose number (from 0) is
    not below the count in `<gate>/allow` waits until it is (no file: every call runs)."""

    def __init__(self, inner: Engine, gate: Path) -> None:
        self.inner = inner
        self.gate = gate
        self.provider = inner.provider
        self.input_names = inner.input_names
        self._lock = threading.Lock()

    def run(self, feeds: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        with self._lock:
            number = len(engine_calls(self.gate))
            with (self.gate / "calls").open("a") as calls:
                calls.write(f"{len(next(iter(feeds.values())))}\n")
        deadline = time.monotonic() + 120  # a test that forgot to let go does not hang the process
        while number >= allowed(self.gate) and time.monotonic() < deadline:
            time.sleep(0.01)
        return self.inner.run(feeds)


def gated_factory(version: ModelVersion, variant: str, settings: Settings) -> Engine:
    engine = ort_engine_factory(version, variant, settings)
    if version.manifest.task != "text-classification":
        return engine
    return GatedEngine(engine, Path(os.environ[GATE_ENV]))


def engine_calls(gate: Path) -> list[int]:
    """Each classifier engine call so far (every engine core's), as its batch size."""
    try:
        return [int(line) for line in (gate / "calls").read_text().split()]
    except FileNotFoundError:
        return []


def allowed(gate: Path) -> float:
    try:
        return int((gate / "allow").read_text())
    except (FileNotFoundError, ValueError):
        return math.inf


GATED_MAIN = (
    "from service.__main__ import main; from tests.service.gated_core import gated_factory; "
    "main(engine_factory=gated_factory)"
)


@dataclass
class Gated:
    """A service whose classifier engine calls the test holds and counts."""

    service: Service
    gate: Path

    def hold(self) -> int:
        """Hold the next engine call (and every later one) until `release`; the calls so far."""
        done = len(engine_calls(self.gate))
        (self.gate / "allow.tmp").write_text(str(done))
        os.replace(self.gate / "allow.tmp", self.gate / "allow")
        return done

    def release(self) -> None:
        (self.gate / "allow").unlink(missing_ok=True)

    def calls(self) -> list[int]:
        return engine_calls(self.gate)

    def metrics(self) -> str:
        return httpx.get(f"{self.service.base_url}/metrics", timeout=60).text

    def queued(self) -> float:
        """Classifier sequences queued in the engine core."""
        return metric(self.metrics(), "distilserve_queue_depth", f'model="{CLS}"')

    def frontends(self) -> set[int]:
        return set(self.service.wait_for_roles(lambda core, frontends: len(frontends) == 2)[1].values())

    def access(self) -> list[dict[str, Any]]:
        return [json.loads(line) for line in self.service.output.splitlines() if line.startswith("{")]


def start_gated(stack: ExitStack, repository: Path, gate: Path, env: dict[str, str] | None = None) -> Gated:
    """Two frontends; the classifier runs one engine call at a time (so a held call holds them all)."""
    environment = {"DISTILSERVE_FRONTENDS": "2", "DISTILSERVE_INSTANCES": "1", GATE_ENV: str(gate)}
    service = stack.enter_context(
        serving(repository, {**environment, **(env or {})}, module="", args=("-c", GATED_MAIN))
    )
    return Gated(service, gate)
