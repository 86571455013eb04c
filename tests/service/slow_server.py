"""`python -m tests.service.slow_server [flags]`: the real entry point, with classification engine calls
slowed by SLOW_ENGINE_S seconds, so a test can be sure requests are in flight when SIGTERM arrives."""

from __future__ import annotations

import os
import time

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


if __name__ == "__main__":
    main(engine_factory=slow_factory)
