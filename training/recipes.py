"""The distillation recipe and every task's default settings, in one place.

Each default in `DEFAULTS` is also a CLI flag, and a flag given on the command line wins; `python -m training
distill --help` prints the table. They are starting points that learn the demo data and suit small real
data sets too. Why they differ:

- Temperature: class and span logits are peaked, so T=2 exposes the teacher's "dark knowledge" (Hinton et
  al., 2015); a language model's next-token distribution is already broad, and T=1 keeps the KD target the
  very distribution the student will sample from.
- Learning rate: a fine-tuned head moves little (1e-4), a language-model student relearns a distribution
  over the whole vocabulary at every token and takes larger steps (5e-4).
- Hidden-state alignment is off by default (alpha_hidden=0): it pays off for deeper students with
  intermediate layers worth aligning (DistilBERT aligned its last layer with a cosine loss).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Literal

HiddenLoss = Literal["cosine", "mse"]
HIDDEN_LOSSES: tuple[HiddenLoss, ...] = ("cosine", "mse")


@dataclass(frozen=True)
class DistillConfig:
    """How the student is cut from the teacher and what it learns from: written into the report."""

    layers: int = 2
    # Teacher layers copied into the student; None: spread over the depth (models.default_layer_map).
    layer_map: tuple[int, ...] | None = None
    hidden_size: int | None = None  # narrower than the teacher: built from config, no weights copied
    temperature: float = 2.0
    alpha_kd: float = 0.5
    alpha_hard: float = 0.5
    # Weight of the hidden-state alignment term (0: off) and its distance; see losses.hidden_alignment_loss.
    alpha_hidden: float = 0.0
    hidden_loss: HiddenLoss = "cosine"


@dataclass(frozen=True)
class TaskDefaults:
    """A task's defaults; the teacher's learning rate depends on whether it starts from scratch."""

    temperature: float
    alpha_kd: float = 0.5
    alpha_hard: float = 0.5
    alpha_hidden: float = 0.0
    hidden_loss: HiddenLoss = "cosine"
    epochs: int = 3
    preset_lr: float = 1e-3  # a teacher trained from scratch (--preset)
    finetune_lr: float = 5e-5  # a teacher fine-tuned from a checkpoint (--model)
    student_lr: float = 1e-4


DEFAULTS: dict[str, TaskDefaults] = {
    "text-classification": TaskDefaults(temperature=2.0),
    "question-answering": TaskDefaults(temperature=2.0),
    "fill-mask": TaskDefaults(temperature=2.0, student_lr=5e-4),
    "text-generation": TaskDefaults(temperature=1.0, student_lr=5e-4),
}


def defaults(task: str) -> TaskDefaults:
    if task not in DEFAULTS:
        raise ValueError(f"no defaults for task {task!r}; known: {', '.join(DEFAULTS)}")
    return DEFAULTS[task]


def distill_config(
    task: str,
    *,
    layers: int = 2,
    layer_map: tuple[int, ...] | None = None,
    hidden_size: int | None = None,
    temperature: float | None = None,
    alpha_kd: float | None = None,
    alpha_hard: float | None = None,
    alpha_hidden: float | None = None,
    hidden_loss: HiddenLoss | None = None,
) -> DistillConfig:
    """The task's defaults with every setting that was given (not None) on top."""
    base = defaults(task)
    return DistillConfig(
        layers=layers,
        layer_map=layer_map,
        hidden_size=hidden_size,
        temperature=base.temperature if temperature is None else temperature,
        alpha_kd=base.alpha_kd if alpha_kd is None else alpha_kd,
        alpha_hard=base.alpha_hard if alpha_hard is None else alpha_hard,
        alpha_hidden=base.alpha_hidden if alpha_hidden is None else alpha_hidden,
        hidden_loss=base.hidden_loss if hidden_loss is None else hidden_loss,
    )


def describe() -> str:
    """One line of defaults per task, for the CLI help."""
    rows = [
        f"{task}: T={d.temperature}, alpha_kd={d.alpha_kd}, alpha_hard={d.alpha_hard}, "
        f"alpha_hidden={d.alpha_hidden} ({d.hidden_loss}), epochs={d.epochs}, "
        f"teacher lr={d.preset_lr:g} (preset) / {d.finetune_lr:g} (fine-tune), student lr={d.student_lr:g}"
        for task, d in DEFAULTS.items()
    ]
    return "\n".join(rows)


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
    # Dropout rate for the run (None: the model's own). 0 on a CPU budget: PyTorch's CPU dropout costs
    # 10-15 % of a small model's step (measured on MiniLM and the demo GPT-2), and a run of one or two
    # passes over its data is not what dropout protects against.
    dropout: float | None = None
    max_steps: int | None = None  # stop early after this many optimiser steps (quick runs, smoke tests)
    seed: int = 0
    mixed_precision: Literal["no", "fp16", "bf16"] = "no"
    cpu: bool = False  # stay on CPU even when a GPU is present
    # Save the full training state under this directory at the end of every epoch.
    checkpoint_dir: str | None = None
    checkpoint_every_steps: int | None = None  # ... and every this many optimiser steps within an epoch
    keep_checkpoints: int = 2  # the newest K checkpoints stay on disk
    # True: continue from the newest checkpoint in checkpoint_dir, or start afresh when it has none.
    # A path: continue from that step-N directory (or from the newest one in that directory).
    resume: bool | str = False
    # Stop after this many evaluations without a better metric; train() then returns the best weights.
    early_stop_patience: int | None = None
    metric_name: str | None = None  # which of evaluate()'s metrics decides; None: the first it returns
    metric_mode: Literal["max", "min"] = "max"  # "min" for lower-is-better metrics (loss, perplexity)

    def __post_init__(self) -> None:
        """Reject settings the loop would otherwise trip over hours later."""
        counts = {
            "epochs": self.epochs,
            "batch_size": self.batch_size,
            "grad_accum_steps": self.grad_accum_steps,
            "max_steps": self.max_steps,
            "checkpoint_every_steps": self.checkpoint_every_steps,
            "keep_checkpoints": self.keep_checkpoints,
            "early_stop_patience": self.early_stop_patience,
        }
        problems = [
            f"{name} must be >= 1" for name, value in counts.items() if value is not None and value < 1
        ]
        if self.dropout is not None and not 0.0 <= self.dropout < 1.0:
            problems.append(f"dropout must be in [0, 1), not {self.dropout}")
        if self.metric_mode not in ("max", "min"):
            problems.append(f"metric_mode must be 'max' or 'min', not {self.metric_mode!r}")
        if self.resume is True and self.checkpoint_dir is None:
            problems.append(
                "resume needs checkpoint_dir (--resume latest needs --checkpoint-dir; or give a checkpoint)"
            )
        if problems:
            raise ValueError("; ".join(problems))

    def to_dict(self) -> dict[str, object]:
        return asdict(self)
