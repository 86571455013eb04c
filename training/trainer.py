"""One training loop for every run: a teacher learning the labels, or a student learning from a teacher.

What differs between the two is only the `step` function (model, batch, teacher) -> LossTerms that the task
module supplies; the loop itself just places things on devices (Accelerate: CPU, one or several GPUs, mixed
precision), steps AdamW on a linear warmup/decay schedule with gradient accumulation, shows progress and
evaluates at the end of each epoch.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from typing import Literal

import torch
import torch.nn as nn
from accelerate import Accelerator
from accelerate.utils import set_seed
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    TextColumn,
    TimeElapsedColumn,
    TimeRemainingColumn,
)
from torch.utils.data import DataLoader
from transformers import get_linear_schedule_with_warmup

from training.losses import LossTerms

Batch = dict[str, torch.Tensor]
# (model being trained, batch on its device, frozen teacher or None) -> loss terms; `total` backpropagates.
StepFn = Callable[[nn.Module, Batch, nn.Module | None], LossTerms]
# The unwrapped model -> metrics, e.g. {"accuracy": 0.91}; called once at the end of every epoch.
EvalFn = Callable[[nn.Module], dict[str, float]]


@dataclass(frozen=True)
class TrainConfig:
    """The optimisation recipe; written verbatim into every run's report."""

    epochs: int = 3
    lr: float = 5e-4
    batch_size: int = 32
    weight_decay: float = 0.01
    warmup_ratio: float = 0.1
    grad_accum_steps: int = 1
    max_grad_norm: float = 1.0
    max_steps: int | None = None  # stop early after this many optimiser steps (quick runs, smoke tests)
    seed: int = 0
    mixed_precision: Literal["no", "fp16", "bf16"] = "no"
    cpu: bool = False  # stay on CPU even when a GPU is present

    def to_dict(self) -> dict[str, object]:
        return asdict(self)


@dataclass
class History:
    """Per optimiser step losses and per epoch summaries (with the eval metrics)."""

    steps: list[dict[str, float]] = field(default_factory=list)
    epochs: list[dict[str, float]] = field(default_factory=list)
    is_main_process: bool = True


def _param_groups(model: nn.Module, weight_decay: float) -> list[dict[str, object]]:
    """No weight decay on biases and LayerNorm weights (the 1-D parameters), as in BERT."""
    params = [p for p in model.parameters() if p.requires_grad]
    return [
        {"params": [p for p in params if p.ndim >= 2], "weight_decay": weight_decay},
        {"params": [p for p in params if p.ndim < 2], "weight_decay": 0.0},
    ]


def _progress(enabled: bool) -> Progress:
    return Progress(
        TextColumn("[bold]{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TextColumn("loss {task.fields[loss]:.4f}"),
        TextColumn("{task.fields[speed]:>6.0f} ex/s"),
        TimeElapsedColumn(),
        TimeRemainingColumn(),
        disable=not enabled,
    )


def train(
    model: nn.Module,
    loader: DataLoader,
    step: StepFn,
    cfg: TrainConfig,
    *,
    teacher: nn.Module | None = None,
    evaluate: EvalFn | None = None,
    description: str = "train",
) -> History:
    """Train `model` in place and return its history. The teacher, if any, stays frozen in eval mode."""
    set_seed(cfg.seed)
    # AdamW moments of rarely-seen embedding rows decay into denormal floats, which x86 CPUs process up
    # to ~10x slower; flushing them to zero changes nothing that matters and keeps CPU steps steady.
    torch.set_flush_denormal(True)
    accelerator = Accelerator(
        mixed_precision=cfg.mixed_precision, gradient_accumulation_steps=cfg.grad_accum_steps, cpu=cfg.cpu
    )
    if teacher is not None:
        teacher.requires_grad_(False)
        teacher.eval().to(accelerator.device)

    optimizer = torch.optim.AdamW(_param_groups(model, cfg.weight_decay), lr=cfg.lr)
    model, optimizer, loader = accelerator.prepare(model, optimizer, loader)
    steps_per_epoch = math.ceil(len(loader) / cfg.grad_accum_steps)
    total_steps = cfg.epochs * steps_per_epoch
    if cfg.max_steps is not None:
        total_steps = min(total_steps, cfg.max_steps)
    scheduler = get_linear_schedule_with_warmup(optimizer, round(cfg.warmup_ratio * total_steps), total_steps)

    history = History(is_main_process=accelerator.is_main_process)
    optimizer_steps = 0
    with _progress(accelerator.is_main_process) as progress:
        bar = progress.add_task(description, total=total_steps, loss=float("nan"), speed=0.0)
        for epoch in range(1, cfg.epochs + 1):
            if optimizer_steps >= total_steps:
                break
            model.train()
            started, examples, loss_sum, loss_count = time.perf_counter(), 0, 0.0, 0
            for batch in loader:
                with accelerator.accumulate(model), accelerator.autocast():
                    terms = step(model, batch, teacher)
                    accelerator.backward(terms.total)
                    if accelerator.sync_gradients and cfg.max_grad_norm > 0:
                        accelerator.clip_grad_norm_(model.parameters(), cfg.max_grad_norm)
                    optimizer.step()  # a no-op until the last micro-batch of an accumulation
                    optimizer.zero_grad(set_to_none=True)
                examples += next(iter(batch.values())).size(0) * accelerator.num_processes
                loss_sum, loss_count = loss_sum + terms.total.item(), loss_count + 1
                if not accelerator.sync_gradients:
                    continue
                scheduler.step()
                optimizer_steps += 1
                speed = examples / (time.perf_counter() - started)
                history.steps.append(
                    {
                        "step": optimizer_steps,
                        "loss": terms.total.item(),
                        "kd": terms.kd.item(),
                        "hard": terms.hard.item(),
                        "lr": scheduler.get_last_lr()[0],
                    }
                )
                progress.update(bar, advance=1, loss=loss_sum / loss_count, speed=speed)
                if optimizer_steps >= total_steps:
                    break

            seconds = time.perf_counter() - started
            record = {
                "epoch": epoch,
                "step": optimizer_steps,
                "train_loss": loss_sum / max(loss_count, 1),
                "examples_per_s": examples / seconds,
                "seconds": seconds,
            }
            if evaluate is not None and accelerator.is_main_process:
                record.update(evaluate(accelerator.unwrap_model(model)))
            accelerator.wait_for_everyone()
            history.epochs.append(record)
            if accelerator.is_main_process:
                shown = "  ".join(f"{k} {v:.4g}" for k, v in record.items() if k not in ("step", "seconds"))
                progress.console.print(f"{description}: {shown}")

    accelerator.unwrap_model(model, keep_fp32_wrapper=False)  # drop the autocast wrapper before saving
    return history
