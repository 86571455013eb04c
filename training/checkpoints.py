"""Checkpoints of a training run: `step-N` directories, which one to resume from, saving and restoring.

A checkpoint holds Accelerate's full training state (model, optimiser, schedule, grad scaler, every
process's RNG states, the best weights so far) plus `trainer_state.json`, where the loop stands (written
last: a directory without it is incomplete). It is saved into a temporary directory renamed once complete,
so a crash mid-save never leaves a checkpoint that looks whole.
"""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

from accelerate import Accelerator

if TYPE_CHECKING:
    from training.recipes import TrainConfig

STATE_FILE = "trainer_state.json"  # written last: a checkpoint directory without it is incomplete
_CHECKPOINT_NAME = re.compile(r"step-(\d+)")


class LoopPosition(Protocol):
    """Where the training loop stands, as a checkpoint stores it (the trainer's loop state)."""

    step: int

    def to_json(self) -> dict[str, Any]: ...

    def load_json(self, saved: dict[str, Any]) -> None: ...


def checkpoints(checkpoint_dir: str | Path) -> list[Path]:
    """The complete checkpoints in a directory, oldest first."""
    found = [
        (int(match.group(1)), path)
        for path in Path(checkpoint_dir).glob("step-*")
        if (match := _CHECKPOINT_NAME.fullmatch(path.name)) and (path / STATE_FILE).is_file()
    ]
    return [path for _, path in sorted(found)]


def checkpoint_to_resume(cfg: TrainConfig) -> Path | None:
    """The checkpoint to continue from, or None to start afresh; never mixes two runs' checkpoints."""
    if cfg.resume is False:
        if cfg.checkpoint_dir is not None and checkpoints(cfg.checkpoint_dir):
            raise ValueError(
                f"{cfg.checkpoint_dir} already holds checkpoints: resume from them or use another directory"
            )
        return None
    path = Path(cfg.resume if isinstance(cfg.resume, str) else str(cfg.checkpoint_dir))
    if (path / STATE_FILE).is_file():
        return path
    found = checkpoints(path) if path.is_dir() else []
    if found:
        return found[-1]
    if cfg.resume is True:  # nothing saved yet, e.g. a preempted job that restarts with the same flags
        return None
    raise ValueError(f"{path}: no checkpoint to resume from")


class Checkpoints:
    """Saves the training state under cfg.checkpoint_dir (a no-op without one) and restores it."""

    def __init__(self, accelerator: Accelerator, cfg: TrainConfig, batches_per_epoch: int) -> None:
        self.accelerator, self.cfg = accelerator, cfg
        self.root = Path(cfg.checkpoint_dir) if cfg.checkpoint_dir is not None else None
        # What must not change between a checkpoint and its resume for "skip the batches done" to hold.
        self.shape = {
            "batches_per_epoch": batches_per_epoch,
            "grad_accum_steps": cfg.grad_accum_steps,
            "num_processes": accelerator.num_processes,
        }

    def due(self, step: int) -> bool:
        """A mid-epoch save after this optimiser step (the epoch's last step is saved by the epoch's end)."""
        every = self.cfg.checkpoint_every_steps
        end_of_epoch = self.accelerator.gradient_state.end_of_dataloader
        return self.root is not None and every is not None and step % every == 0 and not end_of_epoch

    def restore(self, path: Path, state: LoopPosition) -> None:
        saved = json.loads((path / STATE_FILE).read_text())
        changed = {
            k: f"{saved['shape'].get(k)} -> {v}" for k, v in self.shape.items() if saved["shape"].get(k) != v
        }
        if changed:
            raise ValueError(f"cannot resume from {path}: {changed}; keep the data, batching and processes")
        try:
            self.accelerator.load_state(str(path))
        except RuntimeError as e:  # torch's load_state_dict: another model's weights (vocabulary, labels)
            mismatch = str(e).splitlines()[-1].strip()
            raise ValueError(
                f"cannot resume from {path}: it holds another model's weights ({mismatch})"
            ) from e
        state.load_json(saved)

    def save(self, state: LoopPosition) -> None:
        """Save into a temporary directory renamed once complete, then delete all but the newest K."""
        if self.root is None:
            return
        accelerator = self.accelerator
        final, partial = self.root / f"step-{state.step:08d}", self.root / f".step-{state.step:08d}.partial"
        if accelerator.is_main_process:
            shutil.rmtree(partial, ignore_errors=True)  # left by a crash during an earlier save
        accelerator.wait_for_everyone()
        accelerator.save_state(str(partial))  # every process writes its RNG states, the main one the rest
        accelerator.wait_for_everyone()
        if accelerator.is_main_process:
            saved = {**state.to_json(), "shape": self.shape, "config": self.cfg.to_dict()}
            (partial / STATE_FILE).write_text(json.dumps(saved, indent=1))
            shutil.rmtree(final, ignore_errors=True)
            partial.rename(final)
            for old in checkpoints(self.root)[: -self.cfg.keep_checkpoints]:
                shutil.rmtree(old)
        accelerator.wait_for_everyone()
