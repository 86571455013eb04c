"""Log lines are written by threads of their own: a stdout or stderr that blocks never holds the caller."""

from __future__ import annotations

import json
import logging
import threading
import time
from collections.abc import Iterator

import pytest

from service import logs


class BlockedStream:
    """A stdout whose writes wait until released (a full pipe, a stalled log collector)."""

    def __init__(self) -> None:
        self.released = threading.Event()
        self.writing = threading.Event()  # the writer thread is inside write
        self.text: list[str] = []

    def write(self, text: str) -> int:
        self.writing.set()
        self.released.wait(10)
        self.text.append(text)
        return len(text)

    def flush(self) -> None:
        pass


def blocked(stream: str, monkeypatch: pytest.MonkeyPatch, queued_lines: int) -> BlockedStream:
    """sys.stdout or sys.stderr replaced by a blocked stream, and the log queues this short."""
    replacement = BlockedStream()
    monkeypatch.setattr(f"sys.{stream}", replacement)
    monkeypatch.setattr(logs, "QUEUED_LINES", queued_lines)
    return replacement


@pytest.fixture
def access_logger() -> Iterator[logging.Logger]:
    """The access logger (and the root logger), as they were before the test configured them."""
    access, root = logging.getLogger(logs.ACCESS_LOGGER), logging.getLogger()
    saved = (access.handlers[:], access.level, access.propagate, root.handlers[:], root.level)
    yield access
    logs.stop_writing()
    access.handlers[:], access.level, access.propagate = saved[0], saved[1], saved[2]
    root.handlers[:] = saved[3]
    root.setLevel(saved[4])


def test_an_access_line_is_queued_while_stdout_blocks_and_written_once_it_moves(
    access_logger: logging.Logger, monkeypatch: pytest.MonkeyPatch
) -> None:
    stdout = BlockedStream()
    monkeypatch.setattr("sys.stdout", stdout)  # in the test: pytest sets its own capture for each phase
    try:
        logs.configure_logging("info", "json")
        fields = {"request_id": "r1", "method": "POST", "path": "/v1/classify", "status": 200}
        for _ in range(3):  # each returns although the writer is stuck on the first line
            access_logger.info("%s %s %s", "POST", "/v1/classify", 200, extra={"access": fields})
        assert stdout.text == []
    finally:
        stdout.released.set()
    logs.stop_writing()  # what the process does at exit: the queued lines are written first
    lines = [json.loads(line) for line in "".join(stdout.text).splitlines()]
    assert lines == [fields] * 3


def test_a_service_line_waits_for_a_blocked_stderr_in_the_queue_and_lost_lines_are_counted(
    access_logger: logging.Logger, monkeypatch: pytest.MonkeyPatch
) -> None:
    stderr = blocked("stderr", monkeypatch, queued_lines=3)
    uvicorn = logging.getLogger("uvicorn.error")  # unconfigured by the server: it reaches the root logger
    try:
        logs.configure_logging("info", "text")
        uvicorn.info("line 0")
        assert stderr.writing.wait(5)  # the writer holds line 0 ...
        for n in range(1, 6):  # ... three lines wait, two are dropped: no call blocks
            uvicorn.info("line %d", n)
        assert stderr.text == []
    finally:
        stderr.released.set()
    deadline = time.monotonic() + 5
    while len(stderr.text) < 4 and time.monotonic() < deadline:  # the writer catches up
        time.sleep(0.01)
    logging.getLogger("service.core").warning("after")
    logs.stop_writing()
    lines = "".join(stderr.text).splitlines()
    assert [line.split(": ", 1)[1] for line in lines] == [
        *(f"line {n}" for n in range(4)),
        "2 log lines dropped: the stream was blocked",
        "after",
    ]
    assert " INFO uvicorn.error: line 0" in lines[0]


def test_a_stream_blocked_for_good_does_not_hold_the_exit(
    access_logger: logging.Logger, monkeypatch: pytest.MonkeyPatch
) -> None:
    stdout = blocked("stdout", monkeypatch, queued_lines=2)
    logs.configure_logging("info", "json")
    for _ in range(4):  # one held by the writer, two queued, one dropped
        access_logger.info("x", extra={"access": {"path": "/"}})
    started = time.monotonic()
    writers = list(logs._listeners)
    for writer in writers:
        writer.stop(timeout_s=0.2)
    logs._listeners.clear()
    assert time.monotonic() - started < 2
    stdout.released.set()
