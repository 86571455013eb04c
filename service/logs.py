"""Process logging: human text for the service's own messages, and access lines as JSON (or text).

Access lines go to stdout on their own logger (`distilserve.access`), so a log pipeline can parse them
without a pattern; everything else (uvicorn's lines too) goes to stderr for people. Both are formatted and
written by a thread of their own (a QueueHandler in front of each stream): an event loop or an engine thread
only queues the record, and a stream that blocks (a full pipe, a slow collector) never stalls it. The queue
is bounded: a writer that far behind loses lines, counted in one line written when it moves again.
"""

from __future__ import annotations

import atexit
import contextlib
import json
import logging
import sys
from logging.handlers import QueueHandler, QueueListener
from queue import Full, Queue
from typing import Any, Literal

ACCESS_LOGGER = "distilserve.access"
TEXT_FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"
QUEUED_LINES = 10_000  # per stream: beyond, lines are dropped rather than hold the caller


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


class _QueueWithoutWaiting(QueueHandler):
    """Never blocks its caller: when the queue is full the line is dropped, and the next line that fits
    is preceded by one saying how many were lost (called under the handler's lock: the count is safe)."""

    def __init__(self, queue: Queue[logging.LogRecord]) -> None:
        super().__init__(queue)
        self.dropped = 0

    def enqueue(self, record: logging.LogRecord) -> None:
        try:
            if self.dropped:
                note = logging.LogRecord(
                    record.name, logging.WARNING, __file__, 0,
                    f"{self.dropped} log lines dropped: the stream was blocked", None, None,
                )  # fmt: skip
                self.queue.put_nowait(note)
                self.dropped = 0
            self.queue.put_nowait(record)
        except Full:
            self.dropped += 1


class _AccessQueueHandler(_QueueWithoutWaiting):
    """Hands the record over as it is: the listener's formatter reads its `access` fields."""

    def prepare(self, record: logging.LogRecord) -> logging.LogRecord:
        return record


class _Writer(QueueListener):
    """The thread that writes one stream's queued lines; its stop gives up after `timeout_s` (a stream
    blocked for good must not hold the process's exit: the thread is a daemon)."""

    def stop(self, timeout_s: float = 5.0) -> None:
        with contextlib.suppress(Full):
            self.queue.put(self._sentinel, timeout=timeout_s)  # type: ignore[attr-defined]
        if self._thread is not None:
            self._thread.join(timeout_s)
            self._thread = None


_listeners: list[_Writer] = []


def stop_writing() -> None:
    """Write the lines still queued (a few seconds at most), then stop the writer threads."""
    while _listeners:
        _listeners.pop().stop()


def _written_by_a_thread(handler: logging.Handler, queue_handler: type[_QueueWithoutWaiting]) -> QueueHandler:
    queue: Queue[logging.LogRecord] = Queue(QUEUED_LINES)
    listener = _Writer(queue, handler)
    listener.start()
    _listeners.append(listener)
    queued = queue_handler(queue)
    queued.setFormatter(logging.Formatter("%(message)s"))  # message and traceback; `handler` adds the rest
    return queued


atexit.register(stop_writing)


def configure_logging(level: str, access_format: Literal["json", "text"]) -> None:
    """Once per process (uvicorn is then told to keep its own loggers unconfigured: they reach these)."""
    stop_writing()  # configured again (tests): the old writers finish their lines first
    stderr = logging.StreamHandler(sys.stderr)
    stderr.setFormatter(logging.Formatter(TEXT_FORMAT))
    logging.basicConfig(
        level=level.upper(), handlers=[_written_by_a_thread(stderr, _QueueWithoutWaiting)], force=True
    )
    stdout = logging.StreamHandler(sys.stdout)
    stdout.setFormatter(JsonAccessFormatter() if access_format == "json" else TextAccessFormatter())
    access = logging.getLogger(ACCESS_LOGGER)
    access.handlers[:] = [_written_by_a_thread(stdout, _AccessQueueHandler)]
    access.setLevel(level.upper())
    access.propagate = False
