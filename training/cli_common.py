"""What the training CLI's commands share: the typer app they register on, the options several take, and
the checks and helpers behind them (training/cli.py, cli_stages.py, cli_lm.py, cli_lm_eval.py and
cli_embeddings.py hold the commands; importing training.cli registers them all)."""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Literal, cast

import torch
import typer

from common.cli import cli_app, print_error
from training.recipes import HIDDEN_LOSSES, HiddenLoss, TrainConfig, describe
from training.runs import TASKS

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


def available_cores() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not on Linux
        return os.cpu_count() or 1


def setup_threads(threads: int | None) -> None:
    """One intra-op thread per core this process may use: more only adds contention on small models."""
    torch.set_num_threads(threads or available_cores())


def require_file(path: Path | None, flag: str) -> Path:
    """Data files have no default (no hub, no guessing): say what to pass, and where demo data comes from."""
    if path is None:
        raise typer.BadParameter(
            f"missing. Pass {DATA_HELP}; for demo data run `python -m training demo --out DIR`.",
            param_hint=f"'{flag}'",
        )
    return path


def check_out(out: Path, source: str | None, flag: str) -> None:
    """Saving over the model being read would replace it with the result: refuse before any training."""
    if source is not None and Path(source).exists() and out.resolve() == Path(source).resolve():
        raise typer.BadParameter(
            f"{out} is the {flag} directory: the result would overwrite it; write it elsewhere",
            param_hint="'--out'",
        )


def check_task(task: str) -> str:
    if task not in TASKS:
        raise typer.BadParameter(f"unknown task {task!r}; available: {', '.join(TASKS)}", param_hint="--task")
    return task


def check_hidden_loss(value: str | None) -> HiddenLoss | None:
    if value is not None and value not in HIDDEN_LOSSES:
        raise typer.BadParameter(f"choose one of {', '.join(HIDDEN_LOSSES)}", param_hint="--hidden-loss")
    return cast(HiddenLoss | None, value)


def check_precision(value: str) -> Literal["no", "fp16", "bf16"]:
    if value not in MIXED_PRECISION:
        raise typer.BadParameter(
            f"choose one of {', '.join(MIXED_PRECISION)}", param_hint="--mixed-precision"
        )
    return cast(Literal["no", "fp16", "bf16"], value)


@contextmanager
def user_errors() -> Iterator[None]:
    """Bad data or an impossible model shape is the user's to fix: say so in one line, exit 1."""
    try:
        yield
    except (ValueError, OSError) as err:
        print_error(str(err))
        raise typer.Exit(1) from err


StudentInitOpt = typer.Option(
    None,
    "--student-init",
    exists=True,
    file_okay=False,
    help="Start from this student (an earlier run's, or general-distill's output) instead of cutting one "
    "from the teacher; its depth and layer map replace --layers/--layer-map.",
)

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


def train_config(
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
        mixed_precision=check_precision(mixed_precision),
        cpu=cpu,
        early_stop_patience=early_stop_patience,
        checkpoint_dir=None if checkpoint_dir is None else str(checkpoint_dir),
        checkpoint_every_steps=checkpoint_every,
        resume=False if resume is None else True if resume == "latest" else resume,
    )


def parse_layer_map(value: str | None, param_hint: str = "--layer-map") -> tuple[int, ...] | None:
    if value is None:
        return None
    try:
        return tuple(int(part) for part in value.split(","))
    except ValueError as err:
        raise typer.BadParameter(
            f"expected comma-separated layer indices, got {value!r}", param_hint=param_hint
        ) from err
