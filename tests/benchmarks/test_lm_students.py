"""benchmarks.lm_students: eval-lm's scores of several students, per block length, as a table and a plot."""

from __future__ import annotations

import itertools
import json
from pathlib import Path

from typer.testing import CliRunner

from benchmarks.lm_students import app


def _score(
    path: Path, block_size: int, teacher: float, student: float, windows: list[float] | None = None
) -> Path:
    """An eval-lm score file; `windows` the ratios of its first windows of positions (1-64, 64-128, ...)."""
    edges = [1, 64, 128, 256, 512][: len(windows or []) + 1]
    by_position = [
        {"from": lo, "to": hi, "teacher": 10.0, "student": 10.0 * ratio, "ratio": ratio}
        for (lo, hi), ratio in zip(itertools.pairwise(edges), windows or [], strict=True)
    ]
    path.write_text(
        json.dumps(
            {
                "block_size": block_size,
                "eval_blocks": 4,
                "teacher": {"perplexity": teacher},
                "student": {"perplexity": student},
                "perplexity_ratio": student / teacher,
                "agreement": 0.5,
                "by_position": by_position,
            }
        )
    )
    return path


def test_students_are_tabled_and_plotted_per_block_length(tmp_path: Path) -> None:
    short = _score(tmp_path / "a-256.json", 256, 40.0, 50.0)
    long = _score(tmp_path / "a-2048.json", 2048, 20.0, 30.0)
    only_short = _score(tmp_path / "b-256.json", 256, 40.0, 44.0)
    out = tmp_path / "report" / "students"
    result = CliRunner().invoke(app, [f"even={long},{short}", f"circuit={only_short}", "--out", str(out)])
    assert result.exit_code == 0, result.output
    table = out.with_suffix(".md").read_text()
    assert (
        "| student | 256-token blocks: student (teacher) ÷ | 2048-token blocks: student (teacher) ÷ |"
        in table
    )
    assert "| even | 50.00 (40.00) **1.250** | 30.00 (20.00) **1.500** |" in table
    assert "| circuit | 44.00 (40.00) **1.100** | - |" in table  # never scored at 2048
    assert out.with_suffix(".png").read_bytes().startswith(b"\x89PNG")
    bad = CliRunner().invoke(app, ["no-equals-sign", "--out", str(out)])
    assert bad.exit_code == 2 and "LABEL=FILE" in bad.output
    (tmp_path / "empty.json").write_text("")
    bad = CliRunner().invoke(app, [f"empty={tmp_path / 'empty.json'}", "--out", str(out)])
    assert bad.exit_code == 2 and "not an eval-lm score file" in bad.output


def test_the_longest_blocks_windows_of_positions_get_their_own_table(tmp_path: Path) -> None:
    short = _score(tmp_path / "a-256.json", 256, 40.0, 44.0, [0.9, 1.1])
    long = _score(tmp_path / "a-2048.json", 2048, 20.0, 28.0, [0.8, 1.0, 1.2, 1.4])
    whole = _score(tmp_path / "b-256.json", 256, 40.0, 48.0, [1.2])  # one window: nothing to split
    out = tmp_path / "students"
    result = CliRunner().invoke(app, [f"v7={short},{long}", f"v6={whole}", "--out", str(out)])
    assert result.exit_code == 0, result.output
    report = out.with_suffix(".md").read_text()
    assert "| student ÷ teacher, by position in the block | 1-64 | 64-128 | 128-256 | 256-512 |" in report
    assert "| v7 | 0.800 | 1.000 | 1.200 | 1.400 |" in report  # the 2,048-token file's, not the 256's
    assert "| v6 |" not in report.split("by position")[1]
    assert out.with_suffix(".png").read_bytes().startswith(b"\x89PNG")
