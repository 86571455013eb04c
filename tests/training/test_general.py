"""General distillation: a student cut from the teacher learns its hidden states on plain text, keeps the
teacher's head, and the task stage starts from it (`distill --student-init`)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from transformers import BertConfig, BertForQuestionAnswering
from typer.testing import CliRunner

from tests.tiny_models import tiny_bert_settings
from tests.training.test_qa import PROSE
from training import general
from training.cli import app
from training.data.demo import write_demo_data
from training.models import load_trained, make_student
from training.recipes import DistillConfig, TrainConfig
from training.runs import distill, fast_tokenizer
from training.steps import make_alignment
from training.tokenizer import save_tokenizer, train_wordpiece

WORDS = PROSE.split()  # the QA tests' prose, as random lines to align on


pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.fixture(scope="module")
def setup(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """A 4-layer QA teacher (random weights: what matters is that the student can learn to match it), text
    files to align on, and the demo's QA data for the task stage."""
    root = tmp_path_factory.mktemp("general")
    files = write_demo_data(root / "data", n_classification=10, n_qa=40, n_text_lines=10)
    generator = torch.Generator().manual_seed(0)
    lines = [
        " ".join(WORDS[int(i)] for i in torch.randint(len(WORDS), (30,), generator=generator))
        for _ in range(120)
    ]
    (root / "train.txt").write_text("\n".join(lines[:100]) + "\n")
    (root / "eval.txt").write_text("\n".join(lines[100:]) + "\n")
    qa_text = json.loads(Path(files.qa_train).read_text())
    contexts = [p["context"] for a in qa_text["data"] for p in a["paragraphs"]]
    tokenizer = train_wordpiece([*lines, *contexts], vocab_size=400)
    torch.manual_seed(0)
    teacher = BertForQuestionAnswering(
        BertConfig(
            **tiny_bert_settings(len(tokenizer), layers=4, pad_token_id=0, initializer_range=0.5)
        )  # a wide initialisation: layers that change their input, so alignment has work to do
    )
    teacher.save_pretrained(root / "teacher")
    save_tokenizer(tokenizer, root / "teacher")
    return {
        "root": root,
        "teacher": root / "teacher",
        "train": root / "train.txt",
        "eval": root / "eval.txt",
        "qa_train": Path(files.qa_train),
        "qa_eval": Path(files.qa_eval),
    }


def test_a_student_with_every_teacher_layer_is_already_aligned(setup: dict[str, Path]) -> None:
    teacher = load_trained(str(setup["teacher"]), "question-answering").eval()
    student = make_student(teacher, 4, [0, 1, 2, 3]).eval()
    alignment = make_alignment(student, teacher, [0, 1, 2, 3], "mse")
    loader = general.text_loader(
        setup["eval"], fast_tokenizer(setup["teacher"]), batch_size=8, max_length=32, shuffle=False
    )
    assert general.mean_alignment(student, teacher, loader, alignment) == pytest.approx(0.0, abs=1e-10)
    cut = make_student(teacher, 2, [0, 3]).eval()
    assert general.mean_alignment(cut, teacher, loader, make_alignment(cut, teacher, [0, 3], "mse")) > 1e-2


def test_the_cli_aligns_the_student_on_text_and_keeps_the_teachers_head(setup: dict[str, Path]) -> None:
    out = setup["root"] / "general"
    args = ["general-distill", "--task", "question-answering", "--teacher", str(setup["teacher"])]
    args += ["--train", str(setup["train"]), "--eval", str(setup["eval"]), "--out", str(out)]
    args += [
        "--layers",
        "2",
        "--layer-map",
        "0,3",
        "--epochs",
        "4",
        "--batch-size",
        "8",
        "--max-length",
        "32",
    ]
    args += ["--lr", "3e-3", "--dropout", "0"]
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 0, result.output
    report = json.loads((out / "general_report.json").read_text())
    assert report["student"]["layer_map"] == [0, 3] == report["student"]["aligned_teacher_layers"]
    before, after = report["student"]["score_before"], report["student"]["score"]
    assert after < 0.7 * before, (before, after)  # it learnt to stand for the teacher's layers
    student = load_trained(str(out), "question-answering")
    teacher = load_trained(str(setup["teacher"]), "question-answering")
    assert student.config.num_hidden_layers == 2
    # No loss reaches the span head: it is still the teacher's, ready for the task stage.
    for name in ("weight", "bias"):
        assert torch.equal(getattr(student.qa_outputs, name), getattr(teacher.qa_outputs, name))
    assert (out / "tokenizer.json").exists()


def test_the_task_stage_starts_from_the_general_student(setup: dict[str, Path]) -> None:
    out = setup["root"] / "general-for-task"
    CliRunner().invoke(
        app,
        [
            "general-distill",
            "--task",
            "question-answering",
            "--teacher",
            str(setup["teacher"]),
            "--train",
            str(setup["train"]),
            "--eval",
            str(setup["eval"]),
            "--out",
            str(out),
            "--layers",
            "2",
            "--layer-map",
            "1,3",
            "--max-steps",
            "3",
            "--batch-size",
            "8",
            "--max-length",
            "32",
        ],
    )
    # A learning rate of 0: the task stage's student must be the general stage's weights, not a new cut.
    report = distill(
        "question-answering",
        setup["teacher"],
        setup["qa_train"],
        setup["qa_eval"],
        setup["root"] / "task",
        student=DistillConfig(layers=3, layer_map=(0, 1, 2)),  # replaced by the general student's
        cfg=TrainConfig(epochs=1, lr=0.0, batch_size=8, max_steps=1, weight_decay=0.0, dropout=0.0),
        max_length=64,
        student_init=out,
    )
    assert report["student"]["layer_map"] == [1, 3]
    assert report["student"]["initialised_from"] == str(out)
    assert report["student"]["layers"] == 2
    general_student = load_trained(str(out), "question-answering").state_dict()
    task_student = load_trained(str(setup["root"] / "task"), "question-answering").state_dict()
    assert all(torch.equal(general_student[k], task_student[k]) for k in general_student)
