"""`python -m tests.service.crashing_server [flags]`: the real entry point, with every worker dying as it
loads the classification model (as one killed for memory would), so a test can watch the restart backoff."""

from __future__ import annotations

import os

from service.__main__ import main
from service.engine import Engine
from service.repository import ModelVersion
from service.runtime import ort_engine_factory
from service.settings import Settings


def crashing_factory(version: ModelVersion, variant: str, settings: Settings) -> Engine:
    if version.manifest.task == "text-classification":
        os._exit(1)
    return ort_engine_factory(version, variant, settings)


if __name__ == "__main__":
    main(engine_factory=crashing_factory)
