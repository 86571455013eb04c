"""The causal-LM CLI steps the tests share: a cache of a teacher's top-k logits, built as a user would."""

from __future__ import annotations

from pathlib import Path

from typer.testing import CliRunner

from training.cli import app


def cache_with_cli(teacher: Path, text: Path, cache: Path, block_size: int, top_k: int) -> None:
    """`python -m training lm-cache` over `text` into `cache`; fails the test with its output if it fails."""
    result = CliRunner().invoke(
        app,
        [
            "lm-cache", "--teacher", str(teacher), "--threads", "1", "--train", str(text),
            "--out", str(cache), "--block-size", str(block_size), "--top-k", str(top_k),
        ],
    )  # fmt: skip
    assert result.exit_code == 0, result.output
