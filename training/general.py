"""General distillation: before it sees any task data, the student learns to reproduce its teacher's hidden
states on plain text (TinyBERT's first stage; DistilBERT's cosine term over its pre-training corpus).

Why: a student cut from its teacher's layers (0, 2, 5 of 6) starts with layers that never fed each other.
On a task with little data (5 k SQuAD questions) task distillation has too few examples to re-learn how
they fit together; unlabelled text is plentiful and teaches exactly that. The run writes an HF model
directory of the teacher's class and head; `distill --student-init` then starts the task stage from it.
"""

from __future__ import annotations

from dataclasses import asdict, replace
from pathlib import Path
from typing import Any

import torch
import torch.nn as nn
from rich.console import Console
from torch.utils.data import DataLoader
from transformers import PreTrainedTokenizerBase

from common.cli import line_console
from common.provenance import git_revision
from training import fill_mask
from training.batches import make_dataloader, rows
from training.data.loaders import load_text_data
from training.losses import LossTerms
from training.models import count_parameters, load_trained
from training.recipes import DistillConfig, TrainConfig
from training.report import GENERAL_REPORT, file_sha256, now, write_report
from training.runs import check_local, cut_student, fast_tokenizer
from training.steps import HiddenAlignment, make_alignment, model_inputs, trains_with
from training.tokenizer import save_tokenizer
from training.trainer import Batch, StepFn, train

METRIC = "hidden_loss"  # the alignment distance on the eval text, lower is better


def text_loader(
    path: str | Path,
    tokenizer: PreTrainedTokenizerBase,
    *,
    batch_size: int,
    max_length: int,
    shuffle: bool,
    seed: int = 0,
) -> DataLoader:
    """`[CLS] line [SEP]` for every line of a text file, packed into full blocks of `max_length` tokens."""
    packed = fill_mask.blocks(load_text_data(path), tokenizer, max_length)
    return make_dataloader(rows(packed), batch_size=batch_size, shuffle=shuffle, seed=seed)


def alignment_terms(
    student: nn.Module, teacher: nn.Module, batch: Batch, alignment: HiddenAlignment
) -> torch.Tensor:
    """The distance between the student's layers and the teacher layers they stand for, on one batch."""
    inputs = model_inputs(batch)
    with torch.no_grad():
        teacher_hidden = teacher(**inputs, output_hidden_states=True).hidden_states
    student_hidden = student(**inputs, output_hidden_states=True).hidden_states
    return alignment.loss(student_hidden, teacher_hidden, inputs["attention_mask"])


def general_step(alignment: HiddenAlignment) -> StepFn:
    """A training step whose only term is the hidden-state alignment (no logits, no labels)."""

    def step(student: nn.Module, batch: Batch, teacher: nn.Module | None) -> LossTerms:
        if teacher is None:
            raise ValueError("general distillation needs a teacher")
        hidden = alignment_terms(student, teacher, batch, alignment)
        zero = hidden.new_zeros(())
        return LossTerms(total=hidden, kd=zero, hard=zero, hidden=hidden)

    return step


@torch.no_grad()
def mean_alignment(
    student: nn.Module, teacher: nn.Module, loader: DataLoader, alignment: HiddenAlignment
) -> float:
    """The alignment distance averaged over the eval blocks (weighted by their real tokens)."""
    was_training = student.training
    student.eval()
    device = next(student.parameters()).device
    total, tokens = 0.0, 0
    for batch in loader:
        batch = {key: value.to(device) for key, value in batch.items()}
        n = int(batch["attention_mask"].sum())
        total += float(alignment_terms(student, teacher, batch, alignment)) * n
        tokens += n
    student.train(was_training)
    return total / max(tokens, 1)


def _text_record(path: str | Path, loader: DataLoader) -> dict[str, Any]:
    blocks = len(loader.dataset)  # type: ignore[arg-type]  # a list of blocks
    return {"source": str(path), "examples": blocks, "sha256": file_sha256(path)}


def general_distill(
    task_name: str,
    teacher_source: str | Path,
    train_path: str | Path,
    eval_path: str | Path,
    out_dir: str | Path,
    *,
    student: DistillConfig,
    cfg: TrainConfig,
    max_length: int = 128,
    console: Console | None = None,
) -> dict[str, Any]:
    """Cut the student from a trained teacher, train it to match the teacher's hidden states on the train
    text (scored on the eval text), and save it, head and tokenizer included, with `general_report.json`.
    Returns the report."""
    console = console or line_console()
    check_local(teacher_source)
    tokenizer = fast_tokenizer(teacher_source)
    teacher = load_trained(str(teacher_source), task_name).eval()
    max_length = min(max_length, int(teacher.config.max_position_embeddings))
    model, layer_map = cut_student(teacher, student)
    alignment = make_alignment(model, teacher, layer_map, student.hidden_loss)
    train_loader = text_loader(
        train_path, tokenizer, batch_size=cfg.batch_size, max_length=max_length, shuffle=True, seed=cfg.seed
    )
    eval_loader = text_loader(
        eval_path, tokenizer, batch_size=cfg.batch_size, max_length=max_length, shuffle=False
    )

    def evaluate(candidate: Any) -> dict[str, float]:
        return {METRIC: mean_alignment(candidate, teacher, eval_loader, alignment)}

    before = evaluate(model)[METRIC]
    console.print(
        f"[bold]general[/] {student.layers} layers from teacher layers {list(alignment.teacher_layers)}: "
        f"{count_parameters(model):,} params; {len(train_loader)} batches of {max_length}-token blocks; "
        f"eval {student.hidden_loss} {before:.4f}"
    )
    cfg = replace(cfg, metric_name=METRIC, metric_mode="min")
    with trains_with(model, alignment):
        history = train(
            model,
            train_loader,
            general_step(alignment),
            cfg,
            teacher=teacher,
            evaluate=evaluate,
            description="general",
        )
    if not history.is_main_process:
        return {}
    after = evaluate(model)[METRIC]
    out = Path(out_dir)
    model.save_pretrained(out)
    save_tokenizer(tokenizer, out)
    report = {
        "task": task_name,
        "stage": "general distillation",
        "metric": METRIC,
        "higher_is_better": False,
        "train": _text_record(train_path, train_loader),
        "eval": _text_record(eval_path, eval_loader),
        "recipe": {**asdict(student), **cfg.to_dict(), "max_length": max_length},
        "history": history.epochs,
        "teacher": {
            "source": str(teacher_source),
            "params": count_parameters(teacher),
            "layers": int(teacher.config.num_hidden_layers),
        },
        "student": {
            "score": after,
            "score_before": before,
            "params": count_parameters(model),
            "layers": int(model.config.num_hidden_layers),
            "layer_map": layer_map,
            "aligned_teacher_layers": list(alignment.teacher_layers),
        },
        "git_revision": git_revision(),
        "created_at": now(),
    }
    write_report(out, GENERAL_REPORT, report)
    console.print(f"[green]general[/] eval {student.hidden_loss} {before:.4f} -> {after:.4f} -> {out}")
    return report
