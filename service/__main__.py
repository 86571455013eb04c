"""`python -m service [--flags]`: serve the model repository with uvicorn (`--workers N`: N processes)."""

from __future__ import annotations

from service.app import StartupError, create_app
from service.logs import configure_logging
from service.metrics import clear_multiprocess_dir
from service.runtime import EngineFactory, ort_engine_factory
from service.server import serve
from service.settings import parse_cli
from service.workers import supervise


def main(argv: list[str] | None = None, engine_factory: EngineFactory = ort_engine_factory) -> None:
    settings = parse_cli(argv)
    if not settings.model_repository.is_dir():
        raise SystemExit(
            f"distilserve: no model repository at {settings.model_repository}: build the demo one with "
            "`make models`, or point --model-repository (DISTILSERVE_MODEL_REPOSITORY) at yours"
        )
    configure_logging(settings.log_level, settings.log_format)
    if settings.workers > 1:
        raise SystemExit(supervise(settings, engine_factory))
    clear_multiprocess_dir()  # one process told to keep multiprocess metric files: start from none
    try:
        app = create_app(settings, engine_factory)
    except StartupError as e:
        raise SystemExit(f"distilserve: {e}") from e
    serve(app, settings)


if __name__ == "__main__":
    main()
