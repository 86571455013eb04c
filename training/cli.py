"""`python -m training teacher|distill|demo|split`: parse and check the options, then hand over.

Options a task has its own default for (epochs, learning rate, temperature, loss weights) default to None
here and are filled in from `training.recipes.DEFAULTS`, so the CLI and the library share one table.
"""

from __future__ import annotations

from pathlib import Path

import typer

from common.cli import line_console
from training.cli_common import (
    DATA_HELP,
    DEFAULTS_HELP,
    AccumOpt,
    BatchOpt,
    CheckpointDirOpt,
    CheckpointEveryOpt,
    CpuOpt,
    DecayOpt,
    DropoutOpt,
    EpochsOpt,
    EvalOpt,
    MaxLenOpt,
    MaxStepsOpt,
    PatienceOpt,
    PrecisionOpt,
    ResumeOpt,
    SeedOpt,
    StudentInitOpt,
    TaskOpt,
    ThreadsOpt,
    TrainOpt,
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
from training.data.split import split_file
from training.demo import SUPPORTED_TASKS, run_demo
from training.models import PRESETS
from training.recipes import defaults, distill_config
from training.runs import distill, train_teacher


@app.command(epilog=DEFAULTS_HELP)
def teacher(
    out: Path = typer.Option(..., "--out", file_okay=False, help="Output HF model directory."),
    task: str = TaskOpt,
    train: Path | None = TrainOpt,
    eval: Path | None = EvalOpt,
    preset: str | None = typer.Option(
        None, "--preset", help=f"Train from scratch with a config preset: {', '.join(PRESETS)}."
    ),
    model: str | None = typer.Option(None, "--model", help="Fine-tune a local HF directory or a hub id."),
    epochs: int | None = EpochsOpt,
    lr: float | None = typer.Option(
        None, "--lr", help="Peak learning rate (default: per task, one for --preset, one for --model)."
    ),
    batch_size: int = BatchOpt,
    seed: int = SeedOpt,
    max_length: int = MaxLenOpt,
    vocab_size: int = typer.Option(
        4000, "--vocab-size", min=100, help="Vocabulary size (WordPiece or byte-level BPE) with --preset."
    ),
    grad_accum: int = AccumOpt,
    warmup_ratio: float = WarmupOpt,
    weight_decay: float = DecayOpt,
    max_steps: int | None = MaxStepsOpt,
    dropout: float | None = DropoutOpt,
    mixed_precision: str = PrecisionOpt,
    cpu: bool = CpuOpt,
    threads: int | None = ThreadsOpt,
    early_stop_patience: int | None = PatienceOpt,
    checkpoint_dir: Path | None = CheckpointDirOpt,
    checkpoint_every: int | None = CheckpointEveryOpt,
    resume: str | None = ResumeOpt,
) -> None:
    """Train a teacher from scratch (--preset) or fine-tune one (--model): HF dir + train_report.json."""
    task = check_task(task)
    task_defaults = defaults(task)
    train_path, eval_path = require_file(train, "--train"), require_file(eval, "--eval")
    if (preset is None) == (model is None):
        raise typer.BadParameter(
            "give exactly one of --preset NAME or --model PATH_OR_HUB_ID", param_hint="--preset"
        )
    if preset is not None and preset not in PRESETS:
        raise typer.BadParameter(
            f"unknown preset {preset!r}; available: {', '.join(PRESETS)}", param_hint="--preset"
        )
    setup_threads(threads)
    console = line_console()
    source = preset if preset is not None else str(model)
    check_out(out, model, "--model")
    with user_errors():
        cfg = train_config(
            epochs=epochs if epochs is not None else task_defaults.epochs,
            lr=lr if lr is not None else (task_defaults.preset_lr if preset else task_defaults.finetune_lr),
            batch_size=batch_size,
            seed=seed,
            grad_accum=grad_accum,
            warmup_ratio=warmup_ratio,
            weight_decay=weight_decay,
            max_steps=max_steps,
            dropout=dropout,
            mixed_precision=mixed_precision,
            cpu=cpu,
            early_stop_patience=early_stop_patience,
            checkpoint_dir=checkpoint_dir,
            checkpoint_every=checkpoint_every,
            resume=resume,
        )
        train_teacher(
            task,
            train_path,
            eval_path,
            out,
            source=source,
            cfg=cfg,
            max_length=max_length,
            vocab_size=vocab_size,
            console=console,
        )


@app.command(name="distill", epilog=DEFAULTS_HELP)
def distill_command(
    teacher: str = typer.Option(..., "--teacher", help="Trained teacher: an HF directory (or hub id)."),
    out: Path = typer.Option(
        ..., "--out", file_okay=False, help="Output HF model directory for the student."
    ),
    task: str = TaskOpt,
    train: Path | None = TrainOpt,
    eval: Path | None = EvalOpt,
    layers: int = typer.Option(2, "--layers", min=1, help="Student depth."),
    layer_map: str | None = typer.Option(
        None,
        "--layer-map",
        help="Teacher layers to copy, e.g. 0,3 (default: spread over the depth, first and last included).",
    ),
    hidden_size: int | None = typer.Option(
        None, "--hidden-size", min=8, help="Narrower student (built from config, no weights copied)."
    ),
    temperature: float | None = typer.Option(
        None, "--temperature", min=0.01, help="Softmax temperature for soft targets (default: per task)."
    ),
    alpha_kd: float | None = typer.Option(
        None, "--alpha-kd", min=0.0, help="Weight of the T²-scaled KL term (default: per task)."
    ),
    alpha_hard: float | None = typer.Option(
        None, "--alpha-hard", min=0.0, help="Weight of the hard-label term (default: per task)."
    ),
    alpha_hidden: float | None = typer.Option(
        None,
        "--alpha-hidden",
        min=0.0,
        help="Weight of the hidden-state alignment term; 0 turns it off (default: per task).",
    ),
    hidden_loss: str | None = typer.Option(
        None,
        "--hidden-loss",
        help="Hidden-state distance, cosine or mse (default: per task); narrow students add a projection.",
    ),
    epochs: int | None = EpochsOpt,
    lr: float | None = typer.Option(None, "--lr", help="Peak learning rate (default: per task)."),
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
    early_stop_patience: int | None = PatienceOpt,
    checkpoint_dir: Path | None = CheckpointDirOpt,
    checkpoint_every: int | None = CheckpointEveryOpt,
    resume: str | None = ResumeOpt,
    student_init: Path | None = StudentInitOpt,
) -> None:
    """Distil a student from a trained teacher; writes an HF dir + distill_report.json (both scores)."""
    task = check_task(task)
    train_path, eval_path = require_file(train, "--train"), require_file(eval, "--eval")
    check_out(out, teacher, "--teacher")
    student = distill_config(
        task,
        layers=layers,
        layer_map=parse_layer_map(layer_map),
        hidden_size=hidden_size,
        temperature=temperature,
        alpha_kd=alpha_kd,
        alpha_hard=alpha_hard,
        alpha_hidden=alpha_hidden,
        hidden_loss=check_hidden_loss(hidden_loss),
    )
    task_defaults = defaults(task)
    setup_threads(threads)
    console = line_console()
    with user_errors():
        cfg = train_config(
            epochs=epochs if epochs is not None else task_defaults.epochs,
            lr=lr if lr is not None else task_defaults.student_lr,
            batch_size=batch_size,
            seed=seed,
            grad_accum=grad_accum,
            warmup_ratio=warmup_ratio,
            weight_decay=weight_decay,
            max_steps=max_steps,
            dropout=dropout,
            mixed_precision=mixed_precision,
            cpu=cpu,
            early_stop_patience=early_stop_patience,
            checkpoint_dir=checkpoint_dir,
            checkpoint_every=checkpoint_every,
            resume=resume,
        )
        distill(
            task,
            teacher,
            train_path,
            eval_path,
            out,
            student=student,
            cfg=cfg,
            max_length=max_length,
            student_init=student_init,
            console=console,
        )


@app.command()
def demo(
    out: Path = typer.Option(
        ..., "--out", file_okay=False, help="Directory for data/ and <task>/{teacher,student}."
    ),
    tasks: str = typer.Option(
        ",".join(SUPPORTED_TASKS), "--tasks", help=f"Comma-separated tasks: {', '.join(SUPPORTED_TASKS)}."
    ),
    seed: int = SeedOpt,
    quick: bool = typer.Option(False, "--quick", help="Tiny preset and few steps: seconds, for tests."),
    threads: int | None = ThreadsOpt,
) -> None:
    """Per task: generate demo data, train a tokenizer and a from-scratch teacher, distil a student."""
    setup_threads(threads)
    console = line_console()
    chosen = [t.strip() for t in tasks.split(",") if t.strip()]
    with user_errors():
        pairs = run_demo(out, chosen, seed=seed, quick=quick, console=console)
    for task, (teacher_dir, student_dir) in pairs.items():
        console.print(f"[bold]{task}[/]: teacher {teacher_dir}  student {student_dir}")


@app.command()
def split(
    source: Path = typer.Argument(..., exists=True, dir_okay=False, help=f"A data file: {DATA_HELP}."),
    out: Path = typer.Option(..., "--out", file_okay=False, help="Directory for train.<ext> and eval.<ext>."),
    task: str = TaskOpt,
    eval_fraction: float = typer.Option(
        0.1, "--eval-fraction", min=0.0, max=0.9, help="Share of rows (QA: of questions) held out for eval."
    ),
    eval_file: Path | None = typer.Option(
        None,
        "--eval-file",
        exists=True,
        dir_okay=False,
        help="Classification: hold out this labelled file whole as eval (e.g. SST-2's test sentences) "
        "instead of a fraction; training rows that contain one of its texts are left out.",
    ),
    seed: int = typer.Option(0, "--seed", help="Seed for the split; the same seed gives the same files."),
) -> None:
    """Carve train and eval files out of one data file (classification by sentence, SQuAD and WikiText by
    article): no eval text lies word for word inside a training text."""
    console = line_console()
    with user_errors():
        files = split_file(check_task(task), source, out, eval_fraction, seed, eval_file)
    console.print(f"train: {files.train} ({files.n_train})  eval: {files.eval} ({files.n_eval})")
    if files.left_out:
        console.print(f"training rows left out because an eval text lies inside them: {files.left_out}")
    if files.eval_inside_train is not None:
        console.print(f"eval rows lying word for word inside a training row: {files.eval_inside_train}")


def main() -> None:
    app()


# The causal-LM commands (import; lm-cache, distil-lm, eval-lm from a teacher-logit cache), the stages
# around task distillation (general-distill, augment-qa) and sentence-embedding distillation
# (distill-embeddings) and captured traffic as training data (traffic) register on `app` too.
from training import cli_embeddings, cli_lm, cli_lm_eval, cli_stages, cli_traffic  # noqa: E402, F401
