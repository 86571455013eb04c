"""One training loop for every run: a teacher learning the labels, or a student learning from a teacher.

What differs between the two is only the `step` function (model, batch, teacher) -> LossTerms that the task
module supplies; the loop itself just places things on devices (Accelerate: CPU, one or several GPUs, mixed
precision), steps AdamW on a linear warmup/decay schedule with gradient accumulation, shows progress and
evaluates at the end of each epoch.

Optionally it also checkpoints (training/checkpoints.py: Accelerate's full training state plus where the
loop stands, its history and the early-stopping tally) and stops early. Each epoch's shuffle is a function
of (seed, epoch), so a resumed run skips the batches already done and ends with the weights the
uninterrupted run would have reached.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any, ClassVar, Literal, cast

import torch
import torch.nn as nn
from accelerate import Accelerator, PartialState
from accelerate.utils import DataLoaderConfiguration, broadcast_object_list, set_seed
from rich.console import Console
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

from common.progress import ProgressLog
from training.checkpoints import Checkpoints, checkpoint_to_resume
from training.losses import LossTerms
from training.models import set_dropout
from training.recipes import TrainConfig

Batch = dict[str, torch.Tensor]
# (model being trained, batch on its device, frozen teacher or None) -> loss terms; `total` backpropagates.
StepFn = Callable[[nn.Module, Batch, nn.Module | None], LossTerms]
# The unwrapped model -> metrics, e.g. {"accuracy": 0.91}; called once at the end of every epoch.
EvalFn = Callable[[nn.Module], dict[str, float]]

# What an epoch record holds besides evaluate()'s metrics.
EPOCH_FIELDS = frozenset({"epoch", "step", "train_loss", "examples", "examples_per_s", "seconds"})


@dataclass
class History:
    """Per optimiser step losses and per epoch summaries (with the eval metrics).

    Step losses are means over the step's micro-batches and over processes; every process holds the same
    history but for timings (eval metrics are computed on the main process and shared).
    """

    steps: list[dict[str, float]] = field(default_factory=list)
    epochs: list[dict[str, float]] = field(default_factory=list)
    is_main_process: bool = True
    best_epoch: int | None = None  # early stopping: the epoch whose weights train() returned
    stopped_early: bool = False  # early stopping ended the run before its epochs or max_steps

    def final_metrics(self) -> dict[str, float]:
        """What evaluate() said of the returned weights at their epoch's end ({} without evaluate)."""
        return {k: v for k, v in self.final().items() if k not in EPOCH_FIELDS}

    def final(self) -> dict[str, float]:
        """The epoch record that describes the returned weights: the best epoch's under early stopping."""
        if self.best_epoch is not None:
            return next(r for r in self.epochs if r["epoch"] == self.best_epoch)
        return self.epochs[-1] if self.epochs else {}


@dataclass
class _EarlyStopping:
    """Counts the evaluations since the metric last improved; patience None never stops."""

    patience: int | None
    mode: Literal["max", "min"]
    best: float | None = None
    best_epoch: int | None = None
    bad_epochs: int = 0

    def update(self, value: float, epoch: int) -> bool:
        """Record one epoch's metric; True when it is strictly the best so far (a tie keeps the earlier)."""
        better = not math.isnan(value) and (
            self.best is None or (value > self.best if self.mode == "max" else value < self.best)
        )
        if better:
            self.best, self.best_epoch, self.bad_epochs = value, epoch, 0
        else:
            self.bad_epochs += 1
        return better

    @property
    def should_stop(self) -> bool:
        return self.patience is not None and self.bad_epochs >= self.patience


class _BestWeights:
    """A CPU copy of the best epoch's weights, registered for checkpointing so a resumed run still has it."""

    def __init__(self) -> None:
        self.weights: dict[str, torch.Tensor] = {}

    def keep(self, model: nn.Module) -> None:
        self.weights = {k: v.detach().to("cpu", copy=True) for k, v in model.state_dict().items()}

    def state_dict(self) -> dict[str, torch.Tensor]:
        return self.weights

    def load_state_dict(self, state: dict[str, torch.Tensor]) -> None:
        self.weights = dict(state)


@dataclass
class _LoopState:
    """Where the loop stands: besides the tensors Accelerate saves, what a checkpoint needs to continue."""

    history: History
    stopper: _EarlyStopping
    epoch: int = 0  # epochs completed
    step: int = 0  # optimiser steps taken
    batches: int = 0  # micro-batches done in the epoch under way
    epoch_loss: float = 0.0  # sum of the epoch's step losses so far
    epoch_steps: int = 0
    examples: int = 0  # examples the epoch has seen so far, all processes together
    seconds: float = 0.0  # the epoch's time before this process took over (after a resume)
    started: float = field(default_factory=time.perf_counter)
    _SAVED: ClassVar = ("epoch", "step", "batches", "epoch_loss", "epoch_steps", "examples")
    _STOPPER: ClassVar = ("best", "best_epoch", "bad_epochs")

    def elapsed(self) -> float:
        return self.seconds + time.perf_counter() - self.started

    def record_step(self, losses: list[float], lr: float) -> None:
        total, kd, hard = losses
        self.step += 1
        self.epoch_loss, self.epoch_steps = self.epoch_loss + total, self.epoch_steps + 1
        self.history.steps.append({"step": self.step, "loss": total, "kd": kd, "hard": hard, "lr": lr})

    def to_json(self) -> dict[str, Any]:
        return {
            **{name: getattr(self, name) for name in self._SAVED},
            "seconds": self.elapsed(),
            "history": {"steps": self.history.steps, "epochs": self.history.epochs},
            "early_stopping": {name: getattr(self.stopper, name) for name in self._STOPPER},
        }

    def load_json(self, saved: dict[str, Any]) -> None:
        for name in (*self._SAVED, "seconds"):
            setattr(self, name, saved[name])
        for name in self._STOPPER:
            setattr(self.stopper, name, saved["early_stopping"][name])
        self.history.steps, self.history.epochs = saved["history"]["steps"], saved["history"]["epochs"]


def _param_groups(model: nn.Module, weight_decay: float) -> list[dict[str, object]]:
    """No weight decay on biases and LayerNorm weights (the 1-D parameters), as in BERT."""
    params = [p for p in model.parameters() if p.requires_grad]
    return [
        {"params": [p for p in params if p.ndim >= 2], "weight_decay": weight_decay},
        {"params": [p for p in params if p.ndim < 2], "weight_decay": 0.0},
    ]


def _progress(enabled: bool) -> Progress:
    """A bar on a terminal; where it cannot draw (a log file, a pipe) a `ProgressLog` beside it speaks."""
    console = Console()
    return Progress(
        TextColumn("[bold]{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TextColumn("loss {task.fields[loss]:.4f}"),
        TextColumn("{task.fields[speed]:>6.0f} ex/s"),
        TimeElapsedColumn(),
        TimeRemainingColumn(),
        console=console,
        disable=not enabled or not console.is_terminal,
    )


def _epoch_batches(
    accelerator: Accelerator, loader: Any, epoch: int, skip: int, seed: int
) -> Iterable[Batch]:
    """The epoch's batches but the first `skip` (done before a resume); the order depends on (seed, epoch).

    The iterator of a resumed epoch gets a generator of its own: it must not draw its worker seed from the
    global RNG the checkpoint restored, since the uninterrupted run drew that before the checkpoint.
    """
    loader.set_epoch(epoch)
    if skip == 0:
        return cast(Iterable[Batch], loader)
    if loader.generator is None:
        loader.generator = torch.Generator().manual_seed(seed)
    return cast(Iterable[Batch], accelerator.skip_first_batches(loader, skip))


def _end_epoch(
    accelerator: Accelerator,
    model: nn.Module,
    cfg: TrainConfig,
    state: _LoopState,
    evaluate: EvalFn | None,
    best: _BestWeights,
) -> dict[str, float]:
    """Record the epoch with its metrics (evaluated on the main process, shared with all so that every
    process takes the same early-stopping decision) and keep the weights when they are the best so far."""
    seconds = state.elapsed()
    record: dict[str, float] = {
        "epoch": state.epoch + 1,
        "step": state.step,
        "train_loss": state.epoch_loss / max(state.epoch_steps, 1),
        "examples": state.examples,
        "examples_per_s": state.examples / seconds,
        "seconds": seconds,
    }
    metrics = evaluate(accelerator.unwrap_model(model)) if evaluate and accelerator.is_main_process else {}
    metrics = broadcast_object_list([metrics])[0]
    record.update(metrics)
    if cfg.early_stop_patience is not None:
        name = cfg.metric_name or next(iter(metrics), "")
        if name not in metrics:
            raise ValueError(f"early stopping on {name!r}, but evaluate() returned {sorted(metrics)}")
        if state.stopper.update(float(metrics[name]), state.epoch + 1):
            best.keep(accelerator.unwrap_model(model))
    state.history.epochs.append(record)
    state.epoch += 1
    state.batches = state.epoch_steps = state.examples = 0
    state.epoch_loss = state.seconds = 0.0
    state.started = time.perf_counter()
    return record


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
    """Train `model` in place and return its history. The teacher, if any, stays frozen in eval mode.

    With early stopping the model ends with the best epoch's weights (History.best_epoch), whether the
    patience ran out or the epochs did.
    """
    if cfg.early_stop_patience is not None and evaluate is None:
        raise ValueError("early_stop_patience needs an evaluate callback")
    if cfg.mixed_precision == "fp16" and PartialState(cpu=cfg.cpu).device.type == "cpu":
        raise ValueError("fp16 needs a GPU (on CPU Accelerate would silently train in fp32); use bf16")
    with flushing_denormals():
        return _train(model, loader, step, cfg, teacher, evaluate, description)


@contextmanager
def flushing_denormals() -> Iterator[None]:
    """AdamW moments of rarely-seen embedding rows decay into denormal floats, which x86 CPUs process up to
    ~10x slower; flushing them to zero changes nothing that matters and keeps CPU steps steady. The flag is
    the whole process's (the CPU's control register): off again afterwards, as it was, for code that relies
    on IEEE subnormals (hypothesis refuses to generate floats without them)."""
    torch.set_flush_denormal(True)
    try:
        yield
    finally:
        torch.set_flush_denormal(False)


def _train(
    model: nn.Module,
    loader: DataLoader,
    step: StepFn,
    cfg: TrainConfig,
    teacher: nn.Module | None,
    evaluate: EvalFn | None,
    description: str,
) -> History:
    resume_from = checkpoint_to_resume(cfg)
    set_seed(cfg.seed)
    accelerator = Accelerator(
        mixed_precision=cfg.mixed_precision,
        gradient_accumulation_steps=cfg.grad_accum_steps,
        cpu=cfg.cpu,
        # Shuffle by (seed, epoch): the same order on every process, and again after a resume.
        dataloader_config=DataLoaderConfiguration(use_seedable_sampler=True, data_seed=cfg.seed),
    )
    if cfg.dropout is not None:
        set_dropout(model, cfg.dropout)
    if teacher is not None:
        teacher.requires_grad_(False)
        teacher.eval().to(accelerator.device)

    # Fused: one kernel over all parameters instead of a loop of small ops per tensor; on CPU its step is
    # 8x faster (measured on MiniLM: 155 -> 19 ms), a quarter of a fine-tuning step's time.
    optimizer = torch.optim.AdamW(_param_groups(model, cfg.weight_decay), lr=cfg.lr, fused=True)
    model, optimizer, loader = accelerator.prepare(model, optimizer, loader)
    steps_per_epoch = math.ceil(len(loader) / cfg.grad_accum_steps)
    total_steps = cfg.epochs * steps_per_epoch
    if cfg.max_steps is not None:
        total_steps = min(total_steps, cfg.max_steps)
    # Not prepared: Accelerate would step it once per process; here it steps once per optimiser step.
    scheduler = get_linear_schedule_with_warmup(optimizer, round(cfg.warmup_ratio * total_steps), total_steps)
    best = _BestWeights()
    accelerator.register_for_checkpointing(scheduler, best)

    history = History(is_main_process=accelerator.is_main_process)
    state = _LoopState(history, _EarlyStopping(cfg.early_stop_patience, cfg.metric_mode))
    saver = Checkpoints(accelerator, cfg, batches_per_epoch=len(loader))
    if resume_from is not None:
        saver.restore(resume_from, state)
    main_process = accelerator.is_main_process
    with (
        _progress(main_process) as progress,
        ProgressLog.beside(
            progress.console, description, total_steps, enabled=main_process, completed=state.step
        ) as progress_log,
    ):
        bar = progress.add_task(
            description, total=total_steps, completed=state.step, loss=math.nan, speed=0.0
        )
        while state.epoch < cfg.epochs and state.step < total_steps and not state.stopper.should_stop:
            model.train()
            progress_log.update(status=f"epoch {state.epoch + 1}/{cfg.epochs}")
            batches = _epoch_batches(accelerator, loader, state.epoch, state.batches, cfg.seed)
            state.started = time.perf_counter()
            micro_losses, micro_batches = torch.zeros(3, device=accelerator.device), 0
            for batch in batches:
                with accelerator.accumulate(model):
                    with accelerator.autocast():
                        terms = step(model, batch, teacher)
                    accelerator.backward(terms.total)  # scaled by 1/grad_accum_steps
                    if accelerator.sync_gradients and cfg.max_grad_norm > 0:
                        accelerator.clip_grad_norm_(model.parameters(), cfg.max_grad_norm)
                    optimizer.step()  # a no-op until the last micro-batch of an accumulation
                    optimizer.zero_grad(set_to_none=True)
                micro_losses += torch.stack([terms.total, terms.kd, terms.hard]).detach().float()
                micro_batches += 1
                state.batches += 1
                state.examples += next(iter(batch.values())).size(0) * accelerator.num_processes
                if not accelerator.sync_gradients:
                    continue
                if not optimizer.step_was_skipped:  # fp16 overflow: no update, so no schedule step
                    scheduler.step()
                losses = accelerator.reduce(micro_losses / micro_batches, "mean").tolist()
                micro_losses, micro_batches = torch.zeros_like(micro_losses), 0
                state.record_step(losses, scheduler.get_last_lr()[0])
                mean_loss = state.epoch_loss / state.epoch_steps
                speed = state.examples / state.elapsed()
                progress.update(bar, advance=1, loss=mean_loss, speed=speed)
                progress_log.update(advance=1, loss=f"{mean_loss:.4f}", speed=f"{speed:.0f} ex/s")
                if state.step >= total_steps:
                    break
                if saver.due(state.step):
                    saver.save(state)

            progress_log.update(status=f"epoch {state.epoch + 1}/{cfg.epochs}, evaluating")
            record = _end_epoch(accelerator, model, cfg, state, evaluate, best)
            progress_log.update(status=f"epoch {state.epoch}/{cfg.epochs} done")
            saver.save(state)
            if accelerator.is_main_process:
                hidden = ("step", "seconds", "examples")
                shown = "  ".join(f"{k} {v:.4g}" for k, v in record.items() if k not in hidden)
                progress.console.print(f"{description}: {shown}")

    if cfg.early_stop_patience is not None and best.weights:
        accelerator.unwrap_model(model).load_state_dict(best.weights)
        history.best_epoch = state.stopper.best_epoch
        history.stopped_early = (
            state.stopper.should_stop and state.epoch < cfg.epochs and state.step < total_steps
        )
    accelerator.unwrap_model(model, keep_fp32_wrapper=False)  # drop the autocast wrapper before saving
    return history
