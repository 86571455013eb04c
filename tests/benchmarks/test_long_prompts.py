"""benchmarks.long_prompts end to end on a tiny Llama: prompts scored whole and in chunked prefills agree."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from benchmarks.long_prompts import app
from tests.tiny_models import CORPUS


def test_the_same_scores_at_every_prefill_budget(tiny_llama_dir: Path, tmp_path: Path) -> None:
    from export.pipeline import export_model

    repository = tmp_path / "models"
    assert export_model(tiny_llama_dir, "text-generation", "llama", repository, ("fp32",)).version_dir
    text = tmp_path / "text.txt"
    text.write_text(" ".join(CORPUS * 4))
    args = ["--repository", str(repository), "--model", "llama", "--budgets", "100000,8", "--prompts", "3"]
    args += ["--tokens", "24", "--rounds", "1", "--text", str(text), "--out", str(tmp_path / "report")]
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 0, result.output
    whole, chunked = json.loads((tmp_path / "report" / "long-prompts-llama.json").read_text())
    assert (whole["budget"], chunked["budget"]) == (100000, 8)  # 8 positions a call: chunks of 2 columns
    assert chunked["logprob_sum"][0] == pytest.approx(whole["logprob_sum"][0], abs=1e-3)
    assert whole["rss_after_mib"] > 50 and chunked["rss_ready_mib"] > 50  # the engine core's, found by name
    report = (tmp_path / "report" / "long-prompts-llama.md").read_text()
    assert "| 100,000 |" in report and "| 8 |" in report
