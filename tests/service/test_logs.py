"""Access lines are written by a thread of their own: a stdout that blocks never holds the caller."""

from __future__ import annotations

import json
import logging
import threading
from collections.abc import Iterator

import pytest

from service import logs


class BlockedStream:
    """A stdout whose writes wait until released (a full pipe, a stalled log collector)."""

    def __init__(self) -> None:
        self.released = threading.Event()
        self.text: list[str] = []

    def write(self, text: str) -> int:
        self.released.wait(10)
        self.text.append(text)
        return len(text)

    def flush(self) -> None:
        pass


@pytest.fixture
def access_logger() -> Iterator[logging.Logger]:
    """The access logger, as it was before the test configured it."""
    access = logging.getLogger(logs.ACCESS_LOGGER)
    saved = (access.handlers[:], access.level, access.propagate)
    yield access
    logs._stop_writing()
    access.handlers[:], access.level, access.propagate = saved[0], saved[1], saved[2]


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
    logs._stop_writing()  # what the process does at exit: the queued lines are written first
    lines = [json.loads(line) for line in "".join(stdout.text).splitlines()]
    assert lines == [fields] * 3
