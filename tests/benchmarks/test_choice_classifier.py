"""benchmarks.choice_classifier: a chat model's free and label-held answers to a labelled TSV, scored."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from benchmarks.choice_classifier import app, label_in, label_of
from tests.tiny_models import build_tiny_llama


@pytest.fixture(scope="module")
def chat_repository(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from export.pipeline import export_model

    root = tmp_path_factory.mktemp("choice")
    model_dir = build_tiny_llama(root / "hf", positions=1024)
    assert export_model(model_dir, "text-generation", "chat", root / "repo", ("fp32",)).version_dir
    return root / "repo"


def test_held_answers_are_always_labels(chat_repository: Path, tmp_path: Path) -> None:
    data = tmp_path / "data.tsv"
    data.write_text('sentence\tlabel\na "fine" film\t1\na dull film\t0\nnot good\t0\n', encoding="utf-8")
    args = ["--repository", str(chat_repository), "--model", "chat", "--data", str(data), "--streams", "2"]
    result = CliRunner().invoke(app, [*args, "--out", str(tmp_path / "out")])
    assert result.exit_code == 0, result.output
    results = json.loads((tmp_path / "out" / "choice-classifier-chat.json").read_text())
    assert results["guided_choice"]["labels_given"] == 1.0
    assert all(a in ("negative", "positive") for a in results["guided_choice"]["answers"])
    assert results["free"]["labels_given"] == 0.0  # an untrained model does not answer with a label
    assert "| guided_choice | 100.0% |" in (tmp_path / "out" / "choice-classifier-chat.md").read_text()


def test_label_of_reads_the_first_word() -> None:
    assert label_of(" Positive.", ["negative", "positive"]) == "positive"
    assert label_of("It is negative", ["negative", "positive"]) is None
    assert label_of("", ["negative", "positive"]) is None
    assert label_in("The sentiment is positive.", ["negative", "positive"]) == "positive"
    assert label_in("positive or negative", ["negative", "positive"]) is None
