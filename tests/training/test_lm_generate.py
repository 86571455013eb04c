"""The teacher's continuations as more training text: the teacher's own tokens, resumable, and cacheable."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest
import torch
from typer.testing import CliRunner

from tests.tiny_models import CORPUS, build_tiny_llama, llama_bpe, tiny_llama
from training import lm_cache, lm_generate
from training.cli import app

PROMPT = 6


@pytest.fixture(scope="module")
def tokenizer():
    return llama_bpe()


@pytest.fixture(scope="module")
def teacher(tokenizer):
    return tiny_llama(len(tokenizer), num_hidden_layers=2, std=0.1).eval()


@pytest.fixture(scope="module")
def text(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("text") / "train.txt"
    path.write_text("\n".join(CORPUS[:12]) + "\n")
    return path


def _settings(text: Path, **overrides: object) -> lm_generate.GenerateSettings:
    base = lm_generate.GenerateSettings(
        teacher="tiny",
        source=str(text),
        prompts=5,
        prompt_tokens=PROMPT,
        new_tokens=8,
        temperature=1.0,
        top_p=0.95,
        seed=0,
    )
    return replace(base, **overrides)  # type: ignore[arg-type]


def test_prompts_are_real_openings_cycled_in_a_seeded_order(tokenizer, text: Path) -> None:
    lines = text.read_text().splitlines()
    settings = _settings(text, prompts=30)
    ids = lm_generate.prompt_ids(lines, tokenizer, settings)
    openings = {tuple(tokenizer(line, add_special_tokens=False)["input_ids"][:PROMPT]) for line in lines}
    assert ids.shape == (30, PROMPT)
    assert {tuple(row) for row in ids.tolist()} <= openings
    assert len({tuple(row) for row in ids[:12].tolist()}) == len(openings)  # every line before any repeats
    assert (lm_generate.prompt_ids(lines, tokenizer, settings) == ids).all()
    assert not (lm_generate.prompt_ids(lines, tokenizer, replace(settings, seed=1)) == ids).all()
    with pytest.raises(ValueError, match="no line"):
        lm_generate.prompt_ids(lines, tokenizer, replace(settings, prompt_tokens=10_000))


def test_a_cold_sample_is_the_teachers_greedy_continuation(teacher, tokenizer, text: Path) -> None:
    settings = _settings(text, temperature=0.01, top_p=1.0)
    prompts = torch.from_numpy(lm_generate.prompt_ids(text.read_text().splitlines(), tokenizer, settings)[:3])
    texts = lm_generate.continue_batch(teacher, tokenizer, prompts, settings, seed=0)
    with torch.no_grad():
        greedy = teacher.generate(
            input_ids=prompts,
            attention_mask=torch.ones_like(prompts),
            do_sample=False,
            max_new_tokens=8,
            eos_token_id=tokenizer.eos_token_id,
            pad_token_id=tokenizer.eos_token_id,
        )
    assert texts == tokenizer.batch_decode(greedy, skip_special_tokens=True)
    for prompt, written in zip(prompts, texts, strict=True):
        assert written.startswith(tokenizer.decode(prompt))


def test_continuations_become_lines_without_blanks() -> None:
    assert lm_generate.paragraphs(" A first.\n\n Second line \n") == ["A first.", "Second line"]


def test_an_interrupted_run_resumes_to_the_same_file(teacher, tokenizer, text: Path, tmp_path: Path) -> None:
    settings = _settings(text)
    whole, parts = tmp_path / "whole.txt", tmp_path / "parts.txt"
    assert lm_generate.generate(teacher, tokenizer, whole, settings, batch_size=2) == 5
    assert lm_generate.generate(teacher, tokenizer, parts, settings, batch_size=2, stop_after_batches=1) == 2
    with parts.open("ab") as handle:  # a batch half written when the machine went away
        handle.write(b"half a batch")
    assert lm_generate.generate(teacher, tokenizer, parts, settings, batch_size=2) == 5
    assert parts.read_text() == whole.read_text()
    lines = whole.read_text().splitlines()
    assert len(lines) >= 5 and all(line.strip() == line and line for line in lines)
    assert lm_generate.generate(teacher, tokenizer, whole, settings, batch_size=2) == 5  # done: untouched
    assert whole.read_text().splitlines() == lines
    with pytest.raises(ValueError, match="sampled with"):
        lm_generate.generate(teacher, tokenizer, whole, replace(settings, temperature=0.5))


def test_cli_writes_text_that_lm_cache_takes(tmp_path: Path, text: Path) -> None:
    teacher_dir = build_tiny_llama(tmp_path / "teacher")
    runner = CliRunner()
    out = tmp_path / "generated.txt"
    common = ["--teacher", str(teacher_dir), "--threads", "1"]
    result = runner.invoke(
        app,
        [
            "lm-generate",
            *common,
            "--train",
            str(text),
            "--out",
            str(out),
            "--prompts",
            "6",
            "--prompt-tokens",
            str(PROMPT),
            "--new-tokens",
            "24",
            "--batch-size",
            "4",
        ],
    )
    assert result.exit_code == 0, result.output
    assert "6/6 continuations written" in result.output
    result = runner.invoke(
        app,
        [
            "lm-cache",
            *common,
            "--train",
            str(out),
            "--out",
            str(tmp_path / "cache"),
            "--block-size",
            "16",
            "--top-k",
            "4",
        ],
    )
    assert result.exit_code == 0, result.output
    assert len(lm_cache.open_cache(tmp_path / "cache")) >= 6
