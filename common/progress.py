"""A plain progress line at a steady interval, for output that is not a terminal.

rich's bars and spinners draw only on a terminal: with its output in a file, a 40-minute training run
showed nothing until it ended. Where the bar cannot draw, `ProgressLog` writes a line every
`DISTILSERVE_PROGRESS_INTERVAL_S` seconds (default 15) instead, e.g.

    train: epoch 1/3, 120/500 steps (24%), 3.16 steps/s, elapsed 0:38, ETA 2:00, loss 0.4521

and a last one when the work ends. A timer thread writes the lines, so a long step, evaluation or export
phase still shows the run is alive.
"""

from __future__ import annotations

import os
import sys
import threading
import time
from collections.abc import Callable
from types import TracebackType
from typing import IO, Any, Protocol

INTERVAL_ENV = "DISTILSERVE_PROGRESS_INTERVAL_S"
DEFAULT_INTERVAL_S = 15.0


class Console(Protocol):
    """What `ProgressLog.beside` reads of a rich Console (rich itself is not imported here)."""

    @property
    def is_terminal(self) -> bool: ...

    @property
    def file(self) -> IO[str]: ...


def interval_from_env() -> float:
    """Seconds between lines: DISTILSERVE_PROGRESS_INTERVAL_S, else the default (tests set it short)."""
    value = os.environ.get(INTERVAL_ENV, "")
    try:
        seconds = float(value) if value.strip() else DEFAULT_INTERVAL_S
    except ValueError:
        raise ValueError(f"{INTERVAL_ENV}={value!r}: expected seconds, e.g. 15") from None
    if not seconds > 0:
        raise ValueError(f"{INTERVAL_ENV}={value!r}: expected a positive number of seconds")
    return seconds


def is_terminal(stream: IO[str]) -> bool:
    """Whether a bar can draw on `stream` (a closed or odd stream counts as not a terminal)."""
    try:
        return stream.isatty()
    except (AttributeError, ValueError):
        return False


def clock(seconds: float) -> str:
    """0:38, 12:05, 1:02:03."""
    minutes, secs = divmod(round(seconds), 60)
    hours, minutes = divmod(minutes, 60)
    return f"{hours}:{minutes:02d}:{secs:02d}" if hours else f"{minutes}:{secs:02d}"


class ProgressLog:
    """Plain progress lines while a piece of work runs; silent where a terminal shows a bar instead.

    Use as a context manager around the work and call `update()` as it advances. `active` says whether to
    write at all; by default, when `stream` (stderr) is not a terminal. A caller that draws a rich bar
    builds it with `ProgressLog.beside(console, ...)`, so that exactly one of the two shows.
    """

    def __init__(
        self,
        description: str,
        total: float | None = None,
        *,
        unit: str = "steps",
        completed: float = 0,
        active: bool | None = None,
        stream: IO[str] | None = None,
        interval_s: float | None = None,
        now: Callable[[], float] = time.monotonic,
    ) -> None:
        self.description, self.total, self.unit = description, total, unit
        self.completed = self._start_completed = completed
        self.status = ""
        self.fields: dict[str, str] = {}
        self.stream = stream if stream is not None else sys.stderr
        self.active = not is_terminal(self.stream) if active is None else active
        self.interval_s = interval_from_env() if interval_s is None else interval_s
        self._now = now
        self._started = now()
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    @classmethod
    def beside(
        cls,
        console: Console,
        description: str,
        total: float | None = None,
        *,
        enabled: bool = True,
        **kwargs: Any,
    ) -> ProgressLog:
        """The lines for where `console`'s bar or spinner cannot draw (rich draws only on a terminal)."""
        active = enabled and not console.is_terminal
        return cls(description, total, active=active, stream=console.file, **kwargs)

    def update(
        self,
        *,
        advance: float = 0,
        completed: float | None = None,
        total: float | None = None,
        status: str | None = None,
        **fields: str,
    ) -> None:
        """Record where the work stands: `status` (what it is doing now) leads the line, `fields` (e.g.
        loss="0.4521") follow the ETA; `total` for work whose size is known only once it started."""
        with self._lock:
            self.completed = completed if completed is not None else self.completed + advance
            if total is not None:
                self.total = total
            if status is not None:
                self.status = status
            self.fields.update(fields)

    def line(self) -> str:
        """Where the work stands, in one line: status, done/total, rate, elapsed, ETA, the caller's fields."""
        with self._lock:
            elapsed = self._now() - self._started
            done, total = self.completed, self.total
            rate = (done - self._start_completed) / elapsed if elapsed > 0 else 0.0
            parts = [self.status]
            if total:
                parts.append(f"{_number(done)}/{_number(total)} {self.unit} ({100 * done / total:.0f}%)")
            if done > self._start_completed:
                parts.append(f"{rate:.3g} {self.unit}/s")
            parts.append(f"elapsed {clock(elapsed)}")
            if total and rate > 0 and done < total:
                parts.append(f"ETA {clock((total - done) / rate)}")
            parts += [f"{name.replace('_', ' ')} {value}" for name, value in self.fields.items()]
            return f"{self.description}: " + ", ".join(p for p in parts if p)

    def write(self) -> None:
        """Write the current line now (also what the timer does every interval)."""
        if self.active:
            self.stream.write(self.line() + "\n")
            self.stream.flush()

    def __enter__(self) -> ProgressLog:
        self._started = self._now()
        if self.active:
            self._thread = threading.Thread(target=self._tick, name="progress-log", daemon=True)
            self._thread.start()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
        if exc_type is None:
            self.write()  # the last line: where it ended and how long it took

    def _tick(self) -> None:
        while not self._stop.wait(self.interval_s):
            self.write()


def _number(value: float | None) -> str:
    if value is None:
        return "?"
    return str(int(value)) if float(value).is_integer() else f"{value:.4g}"
