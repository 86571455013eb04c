"""The plain progress line a log gets where no bar can draw: its content, its interval, when it is silent."""

from __future__ import annotations

import io
import threading

import pytest

from common.progress import INTERVAL_ENV, ProgressLog, clock, interval_from_env


class _Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


class _Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_a_line_tells_step_total_rate_elapsed_eta_and_the_callers_fields() -> None:
    now = _Clock()
    log = ProgressLog("train", 500, stream=io.StringIO(), interval_s=60, now=now)
    with log:
        now.now += 40
        log.update(advance=120, status="epoch 1/3", loss="0.4521")
        line = log.line()
    assert line == "train: epoch 1/3, 120/500 steps (24%), 3 steps/s, elapsed 0:40, ETA 2:07, loss 0.4521"


def test_without_a_total_the_line_says_what_runs_and_for_how_long() -> None:
    now = _Clock()
    with ProgressLog("export", stream=io.StringIO(), interval_s=60, now=now) as log:
        now.now += 3725
        log.update(status="building the int8 variant")
        assert log.line() == "export: building the int8 variant, elapsed 1:02:05"


def test_a_resumed_run_counts_its_rate_from_where_it_resumed() -> None:
    now = _Clock()
    with ProgressLog("train", 100, completed=50, stream=io.StringIO(), interval_s=60, now=now) as log:
        now.now += 10
        log.update(advance=10)
        assert "60/100 steps (60%), 1 steps/s, elapsed 0:10, ETA 0:40" in log.line()


def test_lines_come_at_the_interval_and_a_last_one_at_the_end() -> None:
    written = threading.Event()

    class _Stream(io.StringIO):
        def flush(self) -> None:
            written.set()

    stream = _Stream()
    with ProgressLog("bench", 4, unit="runs", stream=stream, interval_s=0.01) as log:
        log.update(advance=1)
        assert written.wait(5)  # the timer wrote while the work stood still
    lines = stream.getvalue().splitlines()
    assert len(lines) >= 2 and all(line.startswith("bench: 1/4 runs (25%)") for line in lines)


def test_silent_where_a_terminal_shows_a_bar_and_when_the_work_fails() -> None:
    terminal = _Terminal()
    with ProgressLog("train", 3, stream=terminal, interval_s=0.001) as log:
        log.update(advance=3)
    assert terminal.getvalue() == ""

    pipe = io.StringIO()
    with pytest.raises(RuntimeError), ProgressLog("train", 3, stream=pipe, interval_s=60):
        raise RuntimeError("boom")
    assert pipe.getvalue() == ""  # no "3/3 done" line after a failure: the traceback speaks


def test_the_interval_comes_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(INTERVAL_ENV, raising=False)
    assert interval_from_env() == 15.0
    monkeypatch.setenv(INTERVAL_ENV, "0.5")
    assert interval_from_env() == 0.5
    for bad in ("soon", "0", "-1"):
        monkeypatch.setenv(INTERVAL_ENV, bad)
        with pytest.raises(ValueError, match=INTERVAL_ENV):
            interval_from_env()


def test_clock() -> None:
    assert [clock(s) for s in (0, 38.4, 725, 3723)] == ["0:00", "0:38", "12:05", "1:02:03"]
