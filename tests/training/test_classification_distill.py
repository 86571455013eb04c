"""Classification end to end: batching, a teacher that learns, a distill run that leaves HF dirs + reports."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from tokenizers import Tokenizer
from transformers import AutoModelForSequenceClassification, AutoTokenizer, BertTokenizerFast
from typer.testing import CliRunner

from training import classification
from training.cli import app
from training.data.types import ClassificationData, ClassificationExample
from training.models import load_teacher
from training.recipes import TrainConfig
from training.report import DISTILL_REPORT, TRAIN_REPORT
from training.tokenizer import train_wordpiece
from training.trainer import train

POSITIVE = ["I loved this film", "a wonderful movie", "great fun, truly brilliant", "what a lovely show"]
NEGATIVE = ["I hated this film", "a dull movie", "terrible and boring", "what an awful show"]


def _data(repeat: int = 8) -> ClassificationData:
    examples = [ClassificationExample(t, 1) for t in POSITIVE] + [
        ClassificationExample(t, 0) for t in NEGATIVE
    ]
    return ClassificationData(
        examples=examples * repeat, label_names=["negative", "positive"], source="memory"
    )


@pytest.fixture(scope="module")
def tokenizer() -> BertTokenizerFast:
    return train_wordpiece(POSITIVE + NEGATIVE, vocab_size=200)


def test_collate_pads_to_the_longest_in_the_batch(tokenizer: BertTokenizerFast) -> None:
    data = ClassificationData(
        [ClassificationExample("great", 1), ClassificationExample("a dull, terrible and boring movie", 0)],
        ["negative", "positive"],
        "memory",
    )
    features = classification.encode(data, tokenizer, {"negative": 0, "positive": 1}, max_length=32)
    batch = classification.collate(features, pad_token_id=0)
    longest = max(len(f["input_ids"]) for f in features)
    assert batch["input_ids"].shape == (2, longest)
    assert batch["attention_mask"].sum(1).tolist() == [len(f["input_ids"]) for f in features]
    assert batch["input_ids"][0, len(features[0]["input_ids"]) :].eq(0).all()
    assert batch["labels"].tolist() == [1, 0]


def test_labels_map_by_name_onto_the_model_ids(tokenizer: BertTokenizerFast) -> None:
    features = classification.encode(_data(1), tokenizer, {"POSITIVE": 0, "NEGATIVE": 1}, max_length=16)
    assert [f["labels"][0] for f in features] == [0] * 4 + [1] * 4
    with pytest.raises(ValueError, match="not among"):
        classification.encode(_data(1), tokenizer, {"good": 0, "bad": 1}, max_length=16)


def test_teacher_training_loss_falls(tokenizer: BertTokenizerFast) -> None:
    torch.manual_seed(0)
    data = _data()
    model = load_teacher(
        "bert-tiny", "text-classification", data.label_names, tokenizer_vocab_size=len(tokenizer)
    )
    loader = classification.make_loader(
        data, tokenizer, model.config, batch_size=8, max_length=16, shuffle=True
    )
    cfg = TrainConfig(epochs=6, lr=3e-3, batch_size=8, warmup_ratio=0.0, seed=0)
    history = train(model, loader, classification.teacher_step, cfg, description="test")

    losses = [s["loss"] for s in history.steps]
    assert len(losses) == 6 * len(loader)
    assert sum(losses[-4:]) / 4 < 0.5 * sum(losses[:4]) / 4
    assert classification.evaluate(model, data, tokenizer, max_length=16)["accuracy"] == 1.0
    assert classification.agreement(model, model, data, tokenizer, max_length=16) == 1.0


def test_gradient_accumulation_and_max_steps(tokenizer: BertTokenizerFast) -> None:
    data = _data()
    model = load_teacher(
        "bert-tiny", "text-classification", data.label_names, tokenizer_vocab_size=len(tokenizer)
    )
    loader = classification.make_loader(
        data, tokenizer, model.config, batch_size=4, max_length=16, shuffle=True
    )
    cfg = TrainConfig(epochs=5, batch_size=4, grad_accum_steps=2, max_steps=3)
    calls: list[int] = []

    def evaluate(model: torch.nn.Module) -> dict[str, float]:
        calls.append(1)
        return {"accuracy": 0.0}

    history = train(model, loader, classification.teacher_step, cfg, evaluate=evaluate, description="test")
    assert [s["step"] for s in history.steps] == [1, 2, 3]
    assert (
        len(history.epochs) == 1 and len(calls) == 1
    )  # 8 micro-batches = 4 steps per epoch; stopped after 3
    assert history.epochs[0]["accuracy"] == 0.0


def test_distill_run_writes_hf_dirs_and_reports(demo_pair: tuple[Path, Path]) -> None:
    teacher_dir, student_dir = demo_pair
    for directory in (teacher_dir, student_dir):
        for name in ("config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json"):
            assert (directory / name).is_file(), directory / name

    report = json.loads((student_dir / DISTILL_REPORT).read_text())
    assert report["task"] == "text-classification" and report["metric"] == "accuracy"
    teacher, student = report["teacher"], report["student"]
    assert 0.0 <= teacher["score"] <= 1.0 and 0.0 <= student["score"] <= 1.0
    assert 0.0 <= report["agreement"] <= 1.0
    assert student["params"] < teacher["params"]
    assert student["layers"] < teacher["layers"]
    assert student["layer_map"] == [0]
    assert teacher["source"] == str(teacher_dir) and teacher["trained_from"] == "bert-tiny"
    assert report["eval"]["source"].endswith("eval.jsonl") and report["eval"]["examples"] > 0
    assert report["train"]["examples"] > report["eval"]["examples"]
    assert {"temperature", "alpha_kd", "alpha_hard", "epochs", "lr", "batch_size", "seed"} <= report[
        "recipe"
    ].keys()
    for role in ("teacher", "student"):
        assert set(report["latency_ms"][role]) == {"batch_1", "batch_32"}
    assert "git_revision" in report and report["created_at"]
    assert (student_dir / "distill_report.md").is_file()

    teacher_report = json.loads((teacher_dir / TRAIN_REPORT).read_text())
    assert teacher_report["teacher"]["score"] == pytest.approx(teacher["score"])  # the same eval split
    assert teacher_report["eval"]["source"] == report["eval"]["source"]


def test_saved_student_reloads_and_its_tokenizer_json_matches(demo_pair: tuple[Path, Path]) -> None:
    _, student_dir = demo_pair
    model = AutoModelForSequenceClassification.from_pretrained(student_dir)
    hf_tokenizer = AutoTokenizer.from_pretrained(student_dir)
    raw = Tokenizer.from_file(str(student_dir / "tokenizer.json"))
    text = "I loved this film, it was wonderful"
    assert raw.encode(text).ids == hf_tokenizer(text)["input_ids"]
    assert set(model.config.id2label.values()) == {"negative", "positive"}


def test_cli_distill_from_the_demo_teacher(demo_pair: tuple[Path, Path], tmp_path: Path) -> None:
    teacher_dir, _ = demo_pair
    data = teacher_dir.parent.parent / "data" / "classification"
    out = tmp_path / "student"
    result = CliRunner().invoke(
        app,
        ["distill", "--teacher", str(teacher_dir), "--train", str(data / "train.jsonl"),
         "--eval", str(data / "eval.jsonl"), "--out", str(out), "--layers", "1", "--layer-map", "1",
         "--epochs", "1", "--max-steps", "2", "--threads", "2", "--dropout", "0"],
    )  # fmt: skip
    assert result.exit_code == 0, result.output
    report = json.loads((out / DISTILL_REPORT).read_text())
    assert report["student"]["layer_map"] == [1]
    assert report["recipe"]["max_steps"] == 2
    assert report["recipe"]["dropout"] == 0.0
    saved = AutoModelForSequenceClassification.from_pretrained(out).config
    assert saved.hidden_dropout_prob == saved.attention_probs_dropout_prob == 0.0


@pytest.mark.parametrize("command", ["teacher", "distill"])
def test_cli_requires_data_files(command: str, tmp_path: Path) -> None:
    args = [command, "--out", str(tmp_path / "out")]
    args += ["--preset", "bert-tiny"] if command == "teacher" else ["--teacher", str(tmp_path)]
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 2
    assert "'--train': missing" in result.output and "demo" in result.output


@pytest.mark.parametrize("command", ["teacher", "distill"])
def test_cli_refuses_to_write_over_the_model_it_reads(command: str, tmp_path: Path) -> None:
    model = tmp_path / "teacher"
    model.mkdir()
    (model / "config.json").write_text("{}")
    data = tmp_path / "train.jsonl"
    data.write_text(json.dumps({"text": "a film", "label": "positive"}) + "\n")
    source = ["--model", str(model)] if command == "teacher" else ["--teacher", str(model)]
    args = [
        command,
        *source,
        "--train",
        str(data),
        "--eval",
        str(data),
        "--out",
        str(model / ".." / "teacher"),
    ]
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 2
    assert (
        f"is the {source[0]} directory: the result would overwrite it; write it elsewhere\n" in result.output
    )
    assert [p.name for p in model.iterdir()] == ["config.json"]


def test_cli_help_lists_every_command() -> None:
    result = CliRunner().invoke(app, ["--help"])
    assert result.exit_code == 0
    for command in ("teacher", "distill", "demo", "split"):
        assert command in result.output


def test_cli_demo_rejects_tasks_it_cannot_build(tmp_path: Path) -> None:
    result = CliRunner().invoke(app, ["demo", "--out", str(tmp_path), "--quick", "--tasks", "summarization"])
    assert result.exit_code == 1
    assert "summarization" in result.output


def test_training_data_with_one_class_is_refused(tmp_path: Path) -> None:
    train = tmp_path / "train.jsonl"
    train.write_text("".join(json.dumps({"text": f"film {i}", "label": "positive"}) + "\n" for i in range(8)))
    args = ["teacher", "--train", str(train), "--eval", str(train), "--preset", "bert-tiny"]
    result = CliRunner().invoke(app, [*args, "--max-steps", "1", "--out", str(tmp_path / "out")])
    assert result.exit_code == 1
    assert "every example is labelled 'positive'; a classifier needs two classes at least" in result.output
