"""Process logging: human text for the service's own messages, and access lines as JSON (or text).

Access lines go to stdout on their own logger (`distilserve.access`), so a log pipeline can parse them
without a pattern; everything else goes to stderr for people. Access lines are formatted and written by a
thread of their own (a QueueHandler in front of the stream): the event loop only queues the record, and a
stdout that blocks (a full pipe, a slow collector) never stalls it.
"""

from __future__ import annotations

import atexit
import json
import logging
import sys
from logging.handlers import QueueHandler, QueueListener
from queue import SimpleQueue
from typing import Any, Literal

ACCESS_LOGGER = "distilserve.access"
TEXT_FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"


def _fields(record: logging.LogRecord) -> dict[str, Any]:
    fields = getattr(record, "access", None)
    if isinstance(fields, dict):
        return fields
    return {"message": record.getMessage()}  # an access-logger line that did not come from the middleware


class JsonAccessFormatter(logging.Formatter):
    """One JSON object per line."""

    def format(self, record: logging.LogRecord) -> str:
        return json.dumps(_fields(record), separators=(",", ":"), default=str)


class TextAccessFormatter(logging.Formatter):
    """`time client "METHOD path" status duration` then whatever else is known, as key=value."""

    LEAD = ("time", "client", "method", "path", "status", "duration_ms")

    def format(self, record: logging.LogRecord) -> str:
        f = _fields(record)
        if "method" not in f:
            return str(f.get("message", ""))
        rest = " ".join(f"{k}={v}" for k, v in f.items() if k not in self.LEAD and v is not None)
        return (
            f'{f["time"]} {f["client"] or "-"} "{f["method"]} {f["path"]}" {f["status"]} '
            f"{f['duration_ms']}ms {rest}"
        ).rstrip()


class _AccessQueueHandler(QueueHandler):
    """Hands the record over as it is: the listener's formatter reads its `access` fields."""

    def prepare(self, record: logging.LogRecord) -> logging.LogRecord:
        return record


_listener: QueueListener | None = None


def _stop_writing() -> None:
    """Write the lines still queued, then stop the writer thread."""
    global _listener
    if _listener is not None:
        _listener.stop()
        _listener = None


atexit.register(_stop_writing)


def configure_logging(level: str, access_format: Literal["json", "text"]) -> None:
    """Once per process, before uvicorn adds its own loggers (it leaves these alone)."""
    global _listener
    logging.basicConfig(level=level.upper(), format=TEXT_FORMAT)
    handler = logging.StreamHandler(sys.stdout)
    handler.setFormatter(JsonAccessFormatter() if access_format == "json" else TextAccessFormatter())
    _stop_writing()  # configured again (tests): the old writer finishes its lines first
    queue: SimpleQueue[logging.LogRecord] = SimpleQueue()
    _listener = QueueListener(queue, handler)
    _listener.start()
    access = logging.getLogger(ACCESS_LOGGER)
    access.handlers[:] = [_AccessQueueHandler(queue)]
    access.setLevel(level.upper())
    access.propagate = False
