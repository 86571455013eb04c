"""`python -m service [--flags]`: serve the model repository with uvicorn (one process per device)."""

from __future__ import annotations

import logging

import uvicorn

from service.app import create_app
from service.settings import parse_cli


def main(argv: list[str] | None = None) -> None:
    settings = parse_cli(argv)
    logging.basicConfig(
        level=settings.log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    uvicorn.run(
        create_app(settings),
        host=settings.host,
        port=settings.port,
        log_level=settings.log_level,
        timeout_graceful_shutdown=int(settings.request_timeout_s),
    )


if __name__ == "__main__":
    main()
