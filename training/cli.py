"""`python -m training teacher|distill|demo|split`: parse and check the options, then hand over.

Options a task has its own default for (epochs, learning rate, temperature, loss weights) default to None
here and are filled in from `training.recipes.DEFAULTS`, so the CLI and the library share one table.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Literal, cast

import torch
import typer

from common.cli import cli_app, line_console, print_error
from training.data.split import split_file
from training.demo import SUPPORTED_TASKS, run_demo
from training.models import PRESETS
from training.recipes import HIDDEN_LOSSES, HiddenLoss, defaults, describe, distill_config
from training.runs import TASKS, distill, train_teacher
from training.trainer import TrainConfig

app = cli_app(
    help="Distil BERT/GPT-2/Llama teachers into small students (PyTorch + HF transformers): classification, "
    "QA, fill-mask, generation and sentence embeddings.",
    no_args_is_help=True,
)

DATA_HELP = (
    "text-classification: a .jsonl file of {text, label} rows or an SST-2 style .tsv/.csv (sentence, label); "
    "question-answering: SQuAD v1.1 .json; fill-mask and text-generation: plain text, one paragraph per line"
)
MIXED_PRECISION = ("no", "fp16", "bf16")
DEFAULTS_HELP = "Per-task defaults (any flag overrides them):\n\n" + describe().replace("\n", "\n\n")


def _available_cores() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not on Linux
        return os.cpu_count() or 1


def _setup_threads(threads: int | None) -> None:
    """One intra-op thread per core this process may use: more only adds contention on small models."""
    torch.set_num_threads(threads or _available_cores())


def _require_file(path: Path | None, flag: str) -> Path:
    """Data files have no default (no hub, no guessing): say what to pass, and where demo data comes from."""
    if path is None:
        raise typer.BadParameter(
            f"missing. Pass {DATA_HELP}; for demo data run `python -m training demo --out DIR`.",
            param_hint=f"'{flag}'",
        )
    return path


def _check_out(out: Path, source: str | None, flag: str) -> None:
    """Saving over the model being read would replace it with the result: refuse before any training."""
    if source is not None and Path(source).exists() and out.resolve() == Path(source).resolve():
        raise typer.BadParameter(
            f"{out} is the {flag} directory: the result would overwrite it; write it elsewhere",
            param_hint="'--out'",
        )


def _check_task(task: str) -> str:
    if task not in TASKS:
        raise typer.BadParameter(f"unknown task {task!r}; available: {', '.join(TASKS)}", param_hint="--task")
    return task


def _check_hidden_loss(value: str | None) -> HiddenLoss | None:
    if value is not None and value not in HIDDEN_LOSSES:
        raise typer.BadParameter(f"choose one of {', '.join(HIDDEN_LOSSES)}", param_hint="--hidden-loss")
    return cast(HiddenLoss | None, value)


def _check_precision(value: str) -> Literal["no", "fp16", "bf16"]:
    if value not in MIXED_PRECISION:
        raise typer.BadParameter(
            f"choose one of {', '.join(MIXED_PRECISION)}", param_hint="--mixed-precision"
        )
    return cast(Literal["no", "fp16", "bf16"], value)


@contextmanager
def _user_errors() -> Iterator[None]:
    """Bad data or an impossible model shape is the user's to fix: say so in one line, exit 1."""
    try:
        yield
    except (ValueError, OSError) as err:
        print_error(str(err))
        raise typer.Exit(1) from err


# Options shared by `teacher` and `distill`.
TaskOpt = typer.Option("text-classification", "--task", help=f"Task: {', '.join(TASKS)}.")
TrainOpt = typer.Option(None, "--train", exists=True, dir_okay=False, help=f"Training data: {DATA_HELP}.")
EvalOpt = typer.Option(
    None, "--eval", exists=True, dir_okay=False, help="Evaluation data (same formats); every score uses it."
)
EpochsOpt = typer.Option(None, "--epochs", min=1, help="Passes over the training data (default: per task).")
BatchOpt = typer.Option(32, "--batch-size", min=1, help="Examples per micro-batch (per device).")
SeedOpt = typer.Option(0, "--seed", help="Seed for initialisation, shuffling and dropout.")
MaxLenOpt = typer.Option(128, "--max-length", min=8, help="Truncate inputs to this many tokens.")
AccumOpt = typer.Option(1, "--grad-accum", min=1, help="Micro-batches per optimiser step.")
WarmupOpt = typer.Option(
    0.1, "--warmup-ratio", min=0.0, max=1.0, help="Share of steps with linear LR warmup."
)
DecayOpt = typer.Option(0.01, "--weight-decay", min=0.0, help="AdamW weight decay (not on biases/LayerNorm).")
MaxStepsOpt = typer.Option(None, "--max-steps", min=1, help="Stop after this many optimiser steps.")
PrecisionOpt = typer.Option("no", "--mixed-precision", help="no, fp16 (GPU) or bf16.")
DropoutOpt = typer.Option(
    None,
    "--dropout",
    min=0.0,
    max=0.99,
    help="Dropout rate for this run (default: the model's own); 0 saves 10-15 % of a CPU step.",
)
CpuOpt = typer.Option(False, "--cpu", help="Train on CPU even when a GPU is present.")
ThreadsOpt = typer.Option(
    None, "--threads", min=1, help="CPU threads for PyTorch (default: available cores)."
)
PatienceOpt = typer.Option(
    None,
    "--early-stop-patience",
    min=1,
    help="Stop after this many epochs without a better eval score (the task's metric); keeps the best.",
)
CheckpointDirOpt = typer.Option(
    None, "--checkpoint-dir", file_okay=False, help="Save the full training state here after every epoch."
)
CheckpointEveryOpt = typer.Option(
    None, "--checkpoint-every", min=1, help="Also checkpoint every this many optimiser steps."
)
ResumeOpt = typer.Option(
    None,
    "--resume",
    help="Continue an interrupted run: 'latest' (newest checkpoint in --checkpoint-dir) or a step-N dir.",
)


def _train_config(
    *,
    epochs: int,
    lr: float,
    batch_size: int,
    seed: int,
    grad_accum: int,
    warmup_ratio: float,
    weight_decay: float,
    max_steps: int | None,
    dropout: float | None,
    mixed_precision: str,
    cpu: bool,
    early_stop_patience: int | None = None,
    checkpoint_dir: Path | None = None,
    checkpoint_every: int | None = None,
    resume: str | None = None,
) -> TrainConfig:
    """The loop's recipe from the options both commands share (TrainConfig checks their combination)."""
    return TrainConfig(
        epochs=epochs,
        lr=lr,
        batch_size=batch_size,
        seed=seed,
        grad_accum_steps=grad_accum,
        warmup_ratio=warmup_ratio,
        weight_decay=weight_decay,
        max_steps=max_steps,
        dropout=dropout,
        mixed_precision=_check_precision(mixed_precision),
        cpu=cpu,
        early_stop_patience=early_stop_patience,
        checkpoint_dir=None if checkpoint_dir is None else str(checkpoint_dir),
        checkpoint_every_steps=checkpoint_every,
        resume=False if resume is None else True if resume == "latest" else resume,
    )


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
    task = _check_task(task)
    task_defaults = defaults(task)
    train_path, eval_path = _require_file(train, "--train"), _require_file(eval, "--eval")
    if (preset is None) == (model is None):
        raise typer.BadParameter(
            "give exactly one of --preset NAME or --model PATH_OR_HUB_ID", param_hint="--preset"
        )
    if preset is not None and preset not in PRESETS:
        raise typer.BadParameter(
            f"unknown preset {preset!r}; available: {', '.join(PRESETS)}", param_hint="--preset"
        )
    _setup_threads(threads)
    console = line_console()
    source = preset if preset is not None else str(model)
    _check_out(out, model, "--model")
    with _user_errors():
        cfg = _train_config(
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


def _parse_layer_map(value: str | None) -> tuple[int, ...] | None:
    if value is None:
        return None
    try:
        return tuple(int(part) for part in value.split(","))
    except ValueError as err:
        raise typer.BadParameter(
            f"expected comma-separated layer indices, got {value!r}", param_hint="--layer-map"
        ) from err


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
    student_init: Path | None = typer.Option(
        None,
        "--student-init",
        exists=True,
        file_okay=False,
        help="Start from this student (e.g. general-distill's output) instead of cutting one from the "
        "teacher; its depth and layer map replace --layers/--layer-map.",
    ),
) -> None:
    """Distil a student from a trained teacher; writes an HF dir + distill_report.json (both scores)."""
    task = _check_task(task)
    train_path, eval_path = _require_file(train, "--train"), _require_file(eval, "--eval")
    _check_out(out, teacher, "--teacher")
    student = distill_config(
        task,
        layers=layers,
        layer_map=_parse_layer_map(layer_map),
        hidden_size=hidden_size,
        temperature=temperature,
        alpha_kd=alpha_kd,
        alpha_hard=alpha_hard,
        alpha_hidden=alpha_hidden,
        hidden_loss=_check_hidden_loss(hidden_loss),
    )
    task_defaults = defaults(task)
    _setup_threads(threads)
    console = line_console()
    with _user_errors():
        cfg = _train_config(
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
    _setup_threads(threads)
    console = line_console()
    chosen = [t.strip() for t in tasks.split(",") if t.strip()]
    with _user_errors():
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
    with _user_errors():
        files = split_file(_check_task(task), source, out, eval_fraction, seed, eval_file)
    console.print(f"train: {files.train} ({files.n_train})  eval: {files.eval} ({files.n_eval})")
    if files.left_out:
        console.print(f"training rows left out because an eval text lies inside them: {files.left_out}")
    if files.eval_inside_train is not None:
        console.print(f"eval rows lying word for word inside a training row: {files.eval_inside_train}")


def main() -> None:
    app()


# The causal-LM commands (import; lm-cache, distil-lm, eval-lm from a teacher-logit cache), the stages
# around task distillation (general-distill, augment-qa) and sentence-embedding distillation
# (distill-embeddings) register on `app` too.
from training import cli_embeddings, cli_lm, cli_stages  # noqa: E402, F401
