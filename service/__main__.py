"""`python -m service [--flags]`: serve the model repository: an engine core and HTTP frontends."""

from __future__ import annotations

import logging
import os

from service.engine_plan import EngineFactory
from service.launcher import supervise
from service.logs import configure_logging
from service.runtime import ort_engine_factory
from service.settings import parse_cli

log = logging.getLogger("distilserve")


def main(argv: list[str] | None = None, engine_factory: EngineFactory = ort_engine_factory) -> None:
    settings = parse_cli(argv)
    if not settings.model_repository.is_dir():
        raise SystemExit(
            f"distilserve: no model repository at {settings.model_repository}: build the demo one with "
            "`make models`, or point --model-repository (DISTILSERVE_MODEL_REPOSITORY) at yours"
        )
    configure_logging(settings.log_level, settings.log_format)
    if os.environ.get("DISTILSERVE_WORKERS"):
        log.warning(
            "DISTILSERVE_WORKERS is gone: the models now load once, in one engine core, behind "
            "DISTILSERVE_FRONTENDS HTTP frontends (see docs/deployment.md); ignoring it"
        )
    raise SystemExit(supervise(settings, engine_factory))


if __name__ == "__main__":
    main()
