"""benchmarks.structured_output: JSON asked of a chat model three ways; only the schema way always fits."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from benchmarks.structured_output import app, fits
from tests.tiny_models import CORPUS, build_tiny_llama


@pytest.fixture(scope="module")
def chat_repository(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from export.pipeline import export_model

    root = tmp_path_factory.mktemp("structured")
    model_dir = build_tiny_llama(root / "hf", positions=1024)  # the question is ~200 byte-level tokens
    result = export_model(model_dir, "text-generation", "chat", root / "repo", ("fp32",))
    assert result.version_dir is not None
    return root / "repo"


def test_the_schema_way_always_fits_and_the_report_says_so(chat_repository: Path, tmp_path: Path) -> None:
    texts = tmp_path / "texts.txt"
    texts.write_text("\n".join(" ".join(CORPUS[i:] + CORPUS[:i]) for i in range(len(CORPUS))) + "\n")
    args = ["--repository", str(chat_repository), "--model", "chat", "--texts", str(texts), "--prompts", "3"]
    args += ["--words", "5", "--streams", "1,2", "--new-tokens", "80", "--rounds", "1"]
    result = CliRunner().invoke(app, [*args, "--out", str(tmp_path / "out")])
    assert result.exit_code == 0, result.output
    results = json.loads((tmp_path / "out" / "structured-output-chat.json").read_text())["results"]
    assert set(results) == {"instructed", "json_object", "json_schema"}
    for runs in results["json_schema"].values():
        assert all(fits(a["text"]) == (True, True) for run in runs for a in run["answers"])
    untrained = [a["text"] for runs in results["instructed"].values() for run in runs for a in run["answers"]]
    assert not any(fits(t)[0] for t in untrained)  # an untrained model does not write JSON when asked
    report = (tmp_path / "out" / "structured-output-chat.md").read_text()
    assert "| json_schema | 2 | 100% | 100% | 0% |" in report
    assert all(run["decode_steps"] > 0 for runs in results["json_schema"].values() for run in runs)
    assert (tmp_path / "out" / "structured-output-chat.png").stat().st_size > 0


def test_fits_reads_the_schema() -> None:
    assert fits('{"topic": "a war", "tone": "neutral", "year": 1914}') == (True, True)
    assert fits('{"topic": "a war", "tone": "sad", "year": 1914}') == (True, False)
    assert fits('{"topic": "a war", "tone": "neutral", "year": true}') == (True, False)
    assert fits('{"topic": "a war", "tone": "neutral", "year": 19140}') == (True, False)
    assert fits("The war began in 1914.") == (False, False)
