"""The quick demo for fill-mask and text-generation, and the CLI on its teachers: HF dirs + reports."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from tokenizers import Tokenizer
from transformers import AutoModelForCausalLM, AutoModelForMaskedLM, AutoTokenizer
from typer.testing import CliRunner

from training.cli import app
from training.demo import build_demo_pairs
from training.report import DISTILL_REPORT, TRAIN_REPORT

TASKS = ("fill-mask", "text-generation")


@pytest.fixture(scope="module")
def lm_pairs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, tuple[Path, Path]]:
    return build_demo_pairs(tmp_path_factory.mktemp("lm-demo"), TASKS, quick=True, seed=0)


@pytest.mark.parametrize("task", TASKS)
def test_quick_demo_writes_hf_dirs_and_reports(lm_pairs: dict[str, tuple[Path, Path]], task: str) -> None:
    teacher_dir, student_dir = lm_pairs[task]
    for directory in (teacher_dir, student_dir):
        for name in ("config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json"):
            assert (directory / name).is_file(), directory / name

    report = json.loads((student_dir / DISTILL_REPORT).read_text())
    metric = {"fill-mask": "accuracy", "text-generation": "perplexity"}[task]
    assert report["task"] == task and report["metric"] == metric
    assert report["higher_is_better"] is (task == "fill-mask")
    teacher, student = report["teacher"], report["student"]
    for entry in (teacher, student):  # a quick demo's masked-token accuracy may be 0 (a few dozen masks)
        assert entry["score"] == entry["metrics"][metric]
        assert 0 <= entry["score"] <= 1 if metric == "accuracy" else entry["score"] >= 1
    assert student["params"] < teacher["params"] and student["layers"] < teacher["layers"]
    assert student["layer_map"] == [0] and 0.0 <= report["agreement"] <= 1.0
    assert report["labels"] == {}
    assert report["eval"]["source"].endswith("eval.txt") and len(report["eval"]["sha256"]) == 64
    assert {"temperature", "alpha_kd", "alpha_hard", "alpha_hidden", "hidden_loss", "lr"} <= report[
        "recipe"
    ].keys()
    for role in ("teacher", "student"):
        assert set(report["latency_ms"][role]) == {"batch_1", "batch_32"}
    teacher_report = json.loads((teacher_dir / TRAIN_REPORT).read_text())
    assert teacher_report["teacher"]["score"] == pytest.approx(teacher["score"])  # the same eval split
    summary = json.loads((teacher_dir.parent.parent / "demo_summary.json").read_text())
    assert summary[task]["student"] == student["score"] and "->" in summary[task]["showcase"]["student"]


def test_saved_mlm_student_fills_masks_with_its_own_tokenizer(lm_pairs: dict[str, tuple[Path, Path]]) -> None:
    _, student_dir = lm_pairs["fill-mask"]
    model = AutoModelForMaskedLM.from_pretrained(student_dir)
    tokenizer = AutoTokenizer.from_pretrained(student_dir)
    text = "I loved this [MASK], it was wonderful."
    assert (
        Tokenizer.from_file(str(student_dir / "tokenizer.json")).encode(text).ids
        == tokenizer(text)["input_ids"]
    )
    logits = model(**tokenizer(text, return_tensors="pt")).logits
    assert logits.shape[-1] == len(tokenizer)


def test_saved_lm_student_generates(lm_pairs: dict[str, tuple[Path, Path]]) -> None:
    _, student_dir = lm_pairs["text-generation"]
    model = AutoModelForCausalLM.from_pretrained(student_dir)
    tokenizer = AutoTokenizer.from_pretrained(student_dir)
    inputs = tokenizer("The film was", return_tensors="pt")
    assert set(inputs) == {"input_ids", "attention_mask"}
    output = model.generate(**inputs, max_new_tokens=4, do_sample=False, pad_token_id=tokenizer.eos_token_id)
    assert output.shape[1] > inputs["input_ids"].shape[1]
    assert model.config.eos_token_id == tokenizer.eos_token_id


def test_cli_distills_a_generation_student_with_hidden_alignment(
    lm_pairs: dict[str, tuple[Path, Path]], tmp_path: Path
) -> None:
    teacher_dir, _ = lm_pairs["text-generation"]
    text = teacher_dir.parent.parent / "data" / "text"
    out = tmp_path / "student"
    result = CliRunner().invoke(
        app,
        ["distill", "--task", "text-generation", "--teacher", str(teacher_dir),
         "--train", str(text / "train.txt"), "--eval", str(text / "eval.txt"), "--out", str(out),
         "--layers", "1", "--hidden-size", "32", "--alpha-hidden", "1.0", "--hidden-loss", "mse",
         "--max-steps", "2", "--threads", "2"],
    )  # fmt: skip
    assert result.exit_code == 0, result.output
    report = json.loads((out / DISTILL_REPORT).read_text())
    recipe = report["recipe"]
    assert (recipe["alpha_hidden"], recipe["hidden_loss"], recipe["max_steps"]) == (1.0, "mse", 2)
    assert recipe["temperature"] == 1.0 and recipe["lr"] == 5e-4  # the task's defaults
    assert report["student"]["hidden_size"] == 32 and report["student"]["aligned_teacher_layers"] == [0]
    assert json.loads((out / "config.json").read_text())["n_embd"] == 32  # no projection saved


def test_cli_teacher_trains_a_fill_mask_preset(
    lm_pairs: dict[str, tuple[Path, Path]], tmp_path: Path
) -> None:
    text = lm_pairs["fill-mask"][0].parent.parent / "data" / "text"
    out = tmp_path / "teacher"
    args = ["teacher", "--task", "fill-mask", "--train", str(text / "train.txt"),
            "--eval", str(text / "eval.txt"), "--out", str(out),
            "--max-steps", "1", "--vocab-size", "300", "--max-length", "32"]  # fmt: skip
    result = CliRunner().invoke(app, [*args, "--preset", "bert-tiny"])
    assert result.exit_code == 0, result.output
    assert json.loads((out / TRAIN_REPORT).read_text())["recipe"]["lr"] == 1e-3  # preset default

    wrong = CliRunner().invoke(app, [*args, "--preset", "gpt2-tiny"])
    assert wrong.exit_code == 1 and "bert" in wrong.output


@pytest.mark.parametrize("command", ["teacher", "distill"])
def test_cli_help_lists_every_option_and_the_task_defaults(
    command: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("COLUMNS", "200")  # rich's help reads the width from here (narrower: names cut with …)
    result = CliRunner().invoke(app, [command, "--help"])
    assert result.exit_code == 0
    options = [
        "--task",
        "--train",
        "--eval",
        "--epochs",
        "--lr",
        "--max-steps",
        "--mixed-precision",
        "--dropout",
    ]
    if command == "distill":
        options += [
            "--temperature",
            "--alpha-kd",
            "--alpha-hard",
            "--alpha-hidden",
            "--hidden-loss",
            "--layers",
        ]
    for option in options:
        assert option in result.output, option
    for task in ("text-classification", "fill-mask", "text-generation"):
        assert task in result.output
