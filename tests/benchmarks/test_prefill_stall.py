"""benchmarks.prefill_stall end to end on a tiny Llama: streams run while a long prompt joins them."""

from __future__ import annotations

import json
from pathlib import Path

from typer.testing import CliRunner

from benchmarks.prefill_stall import app
from tests.tiny_models import CORPUS


def test_it_times_the_streams_around_a_long_prompt_at_each_budget(
    tiny_llama_dir: Path, tmp_path: Path
) -> None:
    from export.pipeline import export_model

    repository = tmp_path / "models"
    assert export_model(tiny_llama_dir, "text-generation", "llama", repository, ("fp32",)).version_dir
    text = tmp_path / "text.txt"
    text.write_text(" ".join(CORPUS * 4))
    args = ["--repository", str(repository), "--model", "llama", "--budgets", "100000,4", "--streams", "2"]
    args += [
        "--tokens",
        "40",
        "--stream-tokens",
        "16",
        "--text",
        str(text),
        "--out",
        str(tmp_path / "report"),
    ]
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 0, result.output
    rows = json.loads((tmp_path / "report" / "prefill-stall-llama.json").read_text())
    assert [row["budget"] for row in rows] == [100000, 4]
    for row in rows:
        assert (
            row["prompt_answer_s"] > 0 and row["median_gap_before_s"] > 0 and row["short_prompt_answer_s"] > 0
        )
        assert any(at > row["prompt_answer_s"] for at, _ in row["gaps"])  # the streams ran on after it
        assert row["longest_gap_s"] >= row["median_gap_before_s"] / 10
    report = (tmp_path / "report" / "prefill-stall-llama.md").read_text()
    assert "| 100,000 |" in report and "| 4 |" in report
    assert (tmp_path / "report" / "prefill-stall-llama.png").stat().st_size > 1000
