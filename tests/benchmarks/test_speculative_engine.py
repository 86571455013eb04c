"""benchmarks.speculative_engine: the teacher alone and drafted by each student version's draft, in one
process, every drafted text checked against the teacher's alone."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from benchmarks.speculative_engine import app
from tests.tiny_models import CORPUS, export_lm_pair


@pytest.fixture(scope="module")
def pair(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("engine-pair")
    return export_lm_pair(
        root, self_student="lm-self", student_variants=("fp32", "draft"), draft_head_tokens=16
    )[0]


def test_each_draft_is_timed_against_the_teacher_alone(pair: Path, tmp_path: Path) -> None:
    texts = tmp_path / "texts.txt"
    paragraphs = [" ".join(CORPUS[i:] + CORPUS[:i]) for i in range(4)]  # lines of 200+ characters
    texts.write_text("\n".join(paragraphs) + "\n", encoding="utf-8")
    args = [
        "--repository",
        str(pair),
        "--teacher",
        "lm-teacher",
        "--draft",
        "lm-self:1",
        "--draft",
        "lm:1:fp32",
    ]
    args += ["--texts", str(texts), "--prompts", "3", "--words", "5", "--new-tokens", "12", "--k", "3"]
    result = CliRunner().invoke(app, [*args, "--out", str(tmp_path / "out")])
    assert result.exit_code == 0, result.output
    tallies = json.loads((tmp_path / "out" / "speculative-engine-lm-teacher.json").read_text())
    assert set(tallies) == {"teacher alone", "lm-self:1", "lm:1:fp32"}
    assert all(t["tokens"] == 3 * 11 for t in tallies.values())  # 12 a request, the first from the prefill
    alone, itself = tallies["teacher alone"], tallies["lm-self:1"]
    assert alone["teacher_steps"] == 3 * 11 and alone["drafted"] == 0
    assert itself["accepted"] >= 0.9 * itself["drafted"] > 0  # its own 8-bit copy, cut: nearly all kept
    assert itself["teacher_steps"] < alone["teacher_steps"]
    report = (tmp_path / "out" / "speculative-engine-lm-teacher.md").read_text()
    assert "| lm-self:1 |" in report and "| lm:1:fp32 |" in report


@pytest.mark.parametrize("draft", ["lm", "lm:x", "lm:9", "lm:1:int8"])
def test_a_draft_it_cannot_find_is_a_usage_error(pair: Path, tmp_path: Path, draft: str) -> None:
    args = ["--repository", str(pair), "--teacher", "lm-teacher", "--draft", draft, "--texts", str(tmp_path)]
    result = CliRunner().invoke(app, [*args, "--out", str(tmp_path / "out")])
    assert result.exit_code == 2 and draft in result.output
