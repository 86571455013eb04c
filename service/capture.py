"""Keep what a served pair's teacher answered as training data for the next student (DISTILSERVE_CAPTURE_DIR).

A distilled student serves real traffic, which is rarely the data it was distilled on; where its teacher
answers anyway (service.cascade: the inputs the student was unsure of, the shadow checks of live agreement,
a pair whose teacher answers directly) those inputs and both answers are the labels a next student learns the
traffic from, at no extra engine cost. `python -m training traffic` turns the files into a training set.
The file format is common.capture's.

Writes never touch the event loop: records go through a bounded queue to one writer thread per process, which
appends to `<dir>/<student>/<UTC time>-<pid>.jsonl` and flushes whenever the queue runs dry. A full queue, a
file at its size cap or a failing disk drops records (counted, `distilserve_capture_dropped_total{reason}`),
never a request. Every record holds a client's text: off unless the operator names a directory.
"""

from __future__ import annotations

import logging
import os
import queue
import threading
import time
from collections.abc import Sequence
from pathlib import Path
from typing import IO, Any

from common.capture import SUFFIX, Answered, Captured, Source
from service.metrics import Metrics
from service.served import ServedModel

log = logging.getLogger(__name__)

QUEUE_RECORDS = 8192  # records waiting for the writer; beyond: dropped ("queue")
DROP_REASONS = ("queue", "full", "error")


class TrafficCapture:
    """The writer of one process: `keep` from the event loop, `close` at shutdown (flushes what is queued)."""

    def __init__(self, directory: Path, max_bytes: int, metrics: Metrics) -> None:
        try:
            directory.mkdir(parents=True, exist_ok=True)
            probe = directory / f".probe-{os.getpid()}"
            probe.write_bytes(b"")
            probe.unlink()
        except OSError as e:
            raise ValueError(f"DISTILSERVE_CAPTURE_DIR {directory}: cannot write there: {e}") from e
        self.directory = directory
        self.max_bytes = max_bytes
        self._metrics = metrics
        self._stamp = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime())
        self._queue: queue.Queue[tuple[str, Captured] | None] = queue.Queue(QUEUE_RECORDS)
        self._files: dict[str, tuple[IO[str], list[int]]] = {}  # student -> (file, [bytes written])
        self._failed = False
        self._students: set[str] = set()  # whose drop counters exist (at 0 until something is dropped)
        self._thread = threading.Thread(target=self._write_all, name="traffic-capture", daemon=True)
        self._thread.start()

    def keep(
        self,
        student: ServedModel,
        teacher: ServedModel,
        source: Source,
        inputs: Sequence[Any],
        theirs: Sequence[Any],
        mine: Sequence[Any] | None,
    ) -> None:
        """Queue one record per input the teacher answered: `theirs` are its answer rows (best first),
        `mine` the student's for the same inputs (None: the student did not answer). Inputs the teacher
        found no answer for are left out: they teach nothing."""
        now = time.time()
        task = student.manifest.task
        if student.name not in self._students:  # every reason's series from the first record: rate() reads 0
            self._students.add(student.name)
            for reason in DROP_REASONS:
                self._metrics.capture_dropped.labels(student.name, reason)
        for i, (given, rows) in enumerate(zip(inputs, theirs, strict=True)):
            if not rows:
                continue
            own = None if mine is None or not mine[i] else _answered(student, mine[i])
            record = Captured(task, source, given, _answered(teacher, rows), own, now)
            try:
                self._queue.put_nowait((student.name, record))
            except queue.Full:
                self._metrics.capture_dropped.labels(student.name, "queue").inc()
                continue
            self._metrics.capture_records.labels(student.name, source).inc()

    def close(self) -> None:
        """Write what is queued, then stop the writer."""
        self._queue.put(None)  # after every record queued before it
        self._thread.join(timeout=10)

    # -- the writer thread ----------------------------------------------------------------------------

    def _write_all(self) -> None:
        while True:
            try:
                item = self._queue.get(timeout=1.0)
            except queue.Empty:
                self._flush()
                continue
            if item is None:
                break
            self._write(*item)
            if self._queue.empty():
                self._flush()
        self._flush()
        for handle, _ in self._files.values():
            handle.close()

    def _write(self, name: str, record: Captured) -> None:
        line = record.line()
        try:
            handle, written = self._file(name)
            size = len(line.encode("utf-8"))
            if written[0] + size > self.max_bytes:
                self._metrics.capture_dropped.labels(name, "full").inc()
                return
            handle.write(line)
            written[0] += size
        except OSError as e:
            self._metrics.capture_dropped.labels(name, "error").inc()
            if not self._failed:  # once: a full disk would say it for every record
                log.error("traffic capture: cannot write under %s: %s", self.directory, e)
                self._failed = True

    def _file(self, student: str) -> tuple[IO[str], list[int]]:
        if student not in self._files:
            folder = self.directory / student
            folder.mkdir(parents=True, exist_ok=True)
            path = folder / f"{self._stamp}-{os.getpid()}{SUFFIX}"
            self._files[student] = (path.open("a", encoding="utf-8"), [path.stat().st_size])
        return self._files[student]

    def _flush(self) -> None:
        for name, (handle, _) in self._files.items():
            try:
                handle.flush()
            except OSError as e:
                self._metrics.capture_dropped.labels(name, "error").inc()
                log.error("traffic capture: cannot write under %s: %s", self.directory, e)


def _answered(model: ServedModel, rows: Any) -> Answered:
    best = {k: v for k, v in rows[0].items() if k != "model"}
    return Answered(model.name, model.manifest.version, best)
