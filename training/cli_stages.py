"""`python -m training general-distill | augment-qa | cross-encoder`: the stages around task distillation.

general-distill teaches a student cut from the teacher the teacher's hidden states on unlabelled text before
any task data (training/general.py); augment-qa widens QA training data with teacher-answered questions
(training/qa_augment.py). Both then feed `distill` (`--student-init`, `--train`). cross-encoder folds a
trained two-label relevance classifier (pairs of texts) into the one-label reranker the service ranks with
(training/relevance.py).
"""

from __future__ import annotations

from pathlib import Path

import torch
import typer

from common.cli import line_console
from common.progress import ProgressLog
from training.cli_common import (
    AccumOpt,
    BatchOpt,
    CpuOpt,
    DecayOpt,
    DropoutOpt,
    MaxLenOpt,
    MaxStepsOpt,
    PrecisionOpt,
    SeedOpt,
    TaskOpt,
    ThreadsOpt,
    WarmupOpt,
    app,
    check_hidden_loss,
    check_out,
    check_task,
    parse_layer_map,
    require_file,
    setup_threads,
    train_config,
    user_errors,
)
from training.general import general_distill
from training.models import load_trained
from training.qa_augment import augment
from training.recipes import distill_config
from training.relevance import as_cross_encoder, squad_pairs
from training.runs import check_local, fast_tokenizer


@app.command(name="general-distill")
def general_distill_command(
    teacher: str = typer.Option(..., "--teacher", help="Trained teacher: an HF directory (or hub id)."),
    out: Path = typer.Option(..., "--out", file_okay=False, help="Output HF model directory (the student)."),
    task: str = TaskOpt,
    train: Path | None = typer.Option(
        None, "--train", exists=True, dir_okay=False, help="Unlabelled plain text, one paragraph a line."
    ),
    eval: Path | None = typer.Option(
        None, "--eval", exists=True, dir_okay=False, help="Held-out plain text the alignment is scored on."
    ),
    layers: int = typer.Option(2, "--layers", min=1, help="Student depth."),
    layer_map: str | None = typer.Option(None, "--layer-map", help="Teacher layers to copy, e.g. 0,2,5."),
    hidden_loss: str = typer.Option("mse", "--hidden-loss", help="cosine or mse (TinyBERT's)."),
    epochs: int = typer.Option(1, "--epochs", min=1, help="Passes over the text."),
    lr: float = typer.Option(1e-4, "--lr", min=0.0, help="Peak learning rate."),
    batch_size: int = BatchOpt,
    seed: int = SeedOpt,
    max_length: int = MaxLenOpt,
    grad_accum: int = AccumOpt,
    warmup_ratio: float = WarmupOpt,
    weight_decay: float = DecayOpt,
    max_steps: int | None = MaxStepsOpt,
    dropout: float | None = DropoutOpt,
    mixed_precision: str = PrecisionOpt,
    cpu: bool = CpuOpt,
    threads: int | None = ThreadsOpt,
) -> None:
    """General distillation: a student cut from the teacher learns to reproduce the teacher's hidden
    states on unlabelled text, before any task data; then `distill --student-init OUT` (TinyBERT's two
    stages)."""
    task = check_task(task)
    train_path, eval_path = require_file(train, "--train"), require_file(eval, "--eval")
    check_out(out, teacher, "--teacher")
    student = distill_config(
        task,
        layers=layers,
        layer_map=parse_layer_map(layer_map),
        hidden_loss=check_hidden_loss(hidden_loss),
    )
    setup_threads(threads)
    with user_errors():
        cfg = train_config(
            epochs=epochs,
            lr=lr,
            batch_size=batch_size,
            seed=seed,
            grad_accum=grad_accum,
            warmup_ratio=warmup_ratio,
            weight_decay=weight_decay,
            max_steps=max_steps,
            dropout=dropout,
            mixed_precision=mixed_precision,
            cpu=cpu,
        )
        general_distill(
            task,
            teacher,
            train_path,
            eval_path,
            out,
            student=student,
            cfg=cfg,
            max_length=max_length,
            console=line_console(),
        )


@app.command(name="augment-qa")
def augment_qa_command(
    teacher: str = typer.Option(..., "--teacher", help="Trained QA teacher: an HF directory (or hub id)."),
    train: Path = typer.Option(..., "--train", exists=True, dir_okay=False, help="SQuAD v1.1 train file."),
    out: Path = typer.Option(..., "--out", dir_okay=False, help="The augmented SQuAD v1.1 file to write."),
    per_question: int = typer.Option(
        2, "--per-question", min=1, help="Other paragraphs of its article each question is asked of."
    ),
    max_length: int = typer.Option(256, "--max-length", min=16, help="The teacher's window, in tokens."),
    seed: int = SeedOpt,
    cpu: bool = CpuOpt,
    threads: int | None = ThreadsOpt,
) -> None:
    """Teacher-labelled augmentation for QA distillation: each training question is also asked of other
    paragraphs of its article, answered by the teacher's best span; the originals are kept as they are."""
    setup_threads(threads)
    with user_errors():
        check_local(teacher)
        model = load_trained(teacher, "question-answering")
        model.to(torch.device("cuda" if torch.cuda.is_available() and not cpu else "cpu"))  # type: ignore[arg-type]
        # Always plain lines: the teacher's pass draws no bar of its own.
        with ProgressLog("augment-qa", unit="windows", active=True) as progress:
            counts = augment(
                model,
                fast_tokenizer(teacher),
                train,
                out,
                per_question=per_question,
                max_length=max_length,
                seed=seed,
                on_batch=lambda done, total: progress.update(completed=done, total=total),
            )
    line_console().print(
        f"{out}: {counts['original']} questions as given + {counts['augmented']} answered by the teacher",
        soft_wrap=True,
    )


@app.command(name="cross-encoder")
def cross_encoder_command(
    model: Path = typer.Argument(..., exists=True, file_okay=False, help="A trained two-label classifier."),
    out: Path = typer.Option(..., "--out", file_okay=False, help="The one-label cross-encoder to write."),
    relevant: str = typer.Option("positive", "--relevant", help="The label that means relevant."),
) -> None:
    """A relevance classifier trained on (query, document) pairs as a reranker: one label, whose logit is
    the log-odds of `--relevant` (its sigmoid is the classifier's probability of it), as rerankers are served
    (/rerank, /v1/rerank, /v1/score)."""
    check_out(out, str(model), "model")
    with user_errors():
        as_cross_encoder(model, out, relevant)
    line_console().print(f"{out}: a cross-encoder of one label, {relevant!r}", soft_wrap=True)


@app.command(name="relevance-pairs")
def relevance_pairs_command(
    squad: Path = typer.Argument(..., exists=True, dir_okay=False, help="A SQuAD v1.1 file."),
    out: Path = typer.Option(..., "--out", file_okay=False, help="Folder for train.jsonl, eval.jsonl."),
    negatives: int = typer.Option(
        3, "--negatives", min=1, help="Other paragraphs a question is paired with."
    ),
    eval_articles: int = typer.Option(6, "--eval-articles", min=1, help="Articles held out whole for eval."),
    seed: int = SeedOpt,
) -> None:
    """(question, paragraph) pairs labelled relevant or other, for a reranker's teacher and student:
    `teacher`/`distill --task text-classification` on them, then `cross-encoder`."""
    with user_errors():
        counts = squad_pairs(squad, out, negatives, eval_articles, seed)
    line_console().print(
        f"{out}: {counts['train']} training pairs, {counts['eval']} eval pairs", soft_wrap=True
    )
