"""benchmarks.grammar_step: a decode step timed plain and under a JSON schema's masks, in-process."""

from __future__ import annotations

import re
from pathlib import Path

from typer.testing import CliRunner

from benchmarks.grammar_step import app


def test_both_ways_are_timed_and_compared(tiny_repository: Path, tmp_path: Path) -> None:
    args = ["--repository", str(tiny_repository), "--model", "tiny-lm", "--rows", "2", "--steps", "3"]
    result = CliRunner().invoke(app, [*args, "--rounds", "2", "--out", str(tmp_path)])
    assert result.exit_code == 0, result.output
    report = (tmp_path / "grammar-step-tiny-lm.md").read_text()
    assert re.search(r"\| plain \| [\d.]+, [\d.]+ \| [\d.]+ \|", report)
    assert re.search(r"\| json_schema \| [\d.]+, [\d.]+ \| [\d.]+ \|", report)
    assert re.search(r"json_schema ÷ plain: \*\*\d\.\d{3}\*\*", report)


def test_an_encoder_is_refused(tiny_repository: Path, tmp_path: Path) -> None:
    args = ["--repository", str(tiny_repository), "--model", "tiny-cls", "--out", str(tmp_path)]
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 2 and "not a generation model" in result.output
