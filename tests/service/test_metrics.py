"""A multiprocess metrics directory given to a server starts empty (an earlier run's files would add up)."""

from __future__ import annotations

from pathlib import Path

import pytest

from service.metrics import clear_multiprocess_dir, multiprocess_dir


def test_a_given_multiprocess_directory_is_emptied_of_metric_files_only(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("PROMETHEUS_MULTIPROC_DIR", raising=False)
    assert multiprocess_dir() is None
    clear_multiprocess_dir()  # unset: nothing to do, nothing created

    directory = tmp_path / "metrics"
    monkeypatch.setenv("PROMETHEUS_MULTIPROC_DIR", str(directory))
    clear_multiprocess_dir()
    assert directory.is_dir() and not any(directory.iterdir())  # created for the workers to write into

    (directory / "counter_123.db").write_bytes(b"old counts")
    (directory / "gauge_livesum_123.db").write_bytes(b"old gauge")
    (directory / "notes.txt").write_text("not ours")
    clear_multiprocess_dir()
    assert sorted(p.name for p in directory.iterdir()) == ["notes.txt"]
