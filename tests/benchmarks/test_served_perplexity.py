"""benchmarks.served_perplexity end to end on a tiny Llama: the service's echo scores equal PyTorch's."""

from __future__ import annotations

import json
import math
from pathlib import Path

from typer.testing import CliRunner

from benchmarks.served_perplexity import app, eval_texts, perplexity
from tests.tiny_models import CORPUS


def test_paragraphs_are_long_lines_cut_at_a_word(tmp_path: Path) -> None:
    text = tmp_path / "eval.txt"
    text.write_text(
        " = Heading = \nshort line\n" + " ".join(["word"] * 30) + "\n" + " ".join(["w"] * 40) + "\n"
    )
    assert eval_texts(text, 5, 1000) == [" ".join(["word"] * 30), " ".join(["w"] * 40)]
    assert eval_texts(text, 1, 22) == ["word word word word"]
    assert perplexity([[-1.0, -1.0], [-1.0]]) == math.exp(1.0)


def test_served_scores_are_pytorchs(tiny_llama_dir: Path, tmp_path: Path) -> None:
    from export.pipeline import export_model

    repository = tmp_path / "models"
    assert export_model(tiny_llama_dir, "text-generation", "llama", repository, ("fp32",)).version_dir
    eval_file = tmp_path / "eval.txt"
    eval_file.write_text("\n".join(" ".join(CORPUS[i : i + 4]) for i in range(0, 12, 2)) + "\n")
    args = ["--repository", str(repository), "--models", "llama", "--eval", str(eval_file), "--texts", "5"]
    args += ["--batch", "2", "--reference", str(tiny_llama_dir), "--out", str(tmp_path / "report")]
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 0, result.output
    (row,) = json.loads((tmp_path / "report" / "served-perplexity-llama.json").read_text())
    assert row["tokens"] > 50 and row["max_token_diff"] < 1e-4
    assert abs(row["served"] - row["pytorch"]) < 1e-3 * row["pytorch"]
