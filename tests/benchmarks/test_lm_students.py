"""benchmarks.lm_students: eval-lm's scores of several students, per block length, as a table and a plot."""

from __future__ import annotations

import json
from pathlib import Path

from typer.testing import CliRunner

from benchmarks.lm_students import app


def _score(path: Path, block_size: int, teacher: float, student: float) -> Path:
    path.write_text(
        json.dumps(
            {
                "block_size": block_size,
                "eval_blocks": 4,
                "teacher": {"perplexity": teacher},
                "student": {"perplexity": student},
                "perplexity_ratio": student / teacher,
                "agreement": 0.5,
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
