"""The training steps every task shares: hard labels only (a teacher), or distillation from a teacher.

A task only says where its logits and labels are (a `Targets` function): class logits against class ids,
masked-token logits against labels that are -100 off the masked tokens, next-token logits shifted against
the tokens that follow, ... The rest is the same for all tasks and lives here: the frozen teacher's
forward, the KD and hard terms, and the optional hidden-state alignment with its projection.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn as nn
from transformers import PreTrainedModel

from training.losses import LossTerms, distillation_loss, hard_loss, hidden_alignment_loss
from training.models import default_layer_map
from training.recipes import DistillConfig, HiddenLoss
from training.trainer import Batch, StepFn

# (model output, batch) -> (logits, labels) as the losses want them: [..., C] logits, [...] labels.
Targets = Callable[[Any, Batch], tuple[torch.Tensor, torch.Tensor]]
# Batch keys that are targets, not model inputs (HF's names; QA's spans have two).
LABEL_KEYS = frozenset({"labels", "start_positions", "end_positions"})


def logits_and_labels(output: Any, batch: Batch) -> tuple[torch.Tensor, torch.Tensor]:
    """The model's logits against the batch's labels, as they come (classification, fill-mask)."""
    return output.logits, batch["labels"]


def model_inputs(batch: Batch) -> Batch:
    """What the model is called with: everything in the batch except the targets."""
    return {key: value for key, value in batch.items() if key not in LABEL_KEYS}


def hard_step(model: nn.Module, batch: Batch, targets: Targets = logits_and_labels) -> LossTerms:
    """Hard labels only: training or fine-tuning a teacher."""
    logits, labels = targets(model(**model_inputs(batch)), batch)
    return hard_loss(logits, labels)


@dataclass(frozen=True)
class HiddenAlignment:
    """Which teacher layer each student layer is pulled towards, by which distance, through which projection.

    HF models return hidden_states = (embeddings output, layer 0 output, layer 1 output, ...). (GPT-2 applies
    its final LayerNorm to the last entry; student and teacher both do, so last-to-last pairs match.)
    """

    teacher_layers: tuple[int, ...]
    kind: HiddenLoss
    projection: nn.Linear | None = None  # student width -> teacher width, trained with the student

    def loss(
        self, student: Sequence[torch.Tensor], teacher: Sequence[torch.Tensor], attention_mask: torch.Tensor
    ) -> torch.Tensor:
        pairs = [(student[i + 1], teacher[t + 1]) for i, t in enumerate(self.teacher_layers)]
        return hidden_alignment_loss(
            torch.stack([s for s, _ in pairs]),
            torch.stack([t for _, t in pairs]),
            attention_mask,
            self.kind,
            self.projection,
        )


def make_alignment(
    student: PreTrainedModel, teacher: PreTrainedModel, layer_map: Sequence[int] | None, kind: HiddenLoss
) -> HiddenAlignment:
    """Student layer i aligns with the teacher layer it was copied from (`layer_map`); a student built from
    config (narrower) with layers spread evenly over the teacher's depth, through a fresh projection."""
    depth, teacher_depth = int(student.config.num_hidden_layers), int(teacher.config.num_hidden_layers)
    teacher_layers = layer_map or default_layer_map(teacher_depth, depth)
    width, teacher_width = int(student.config.hidden_size), int(teacher.config.hidden_size)
    projection = nn.Linear(width, teacher_width) if width != teacher_width else None
    return HiddenAlignment(tuple(teacher_layers), kind, projection)


@contextmanager
def trains_with(model: nn.Module, alignment: HiddenAlignment | None) -> Iterator[None]:
    """Attach the alignment's projection to the model while it trains, then take it off again.

    The trainer optimises (and across devices synchronises) the model's parameters only, so a projection
    that must learn has to be one of them for the run; the saved student stays a plain HF model.
    """
    projection = alignment.projection if alignment is not None else None
    if projection is None:
        yield
        return
    model.add_module("hidden_projection", projection)
    try:
        yield
    finally:
        delattr(model, "hidden_projection")


class TeacherMemo:
    """The frozen teacher's logits per example, kept from the first epoch for the next ones.

    A frozen teacher in eval mode gives an example the same logits every epoch, so a student's later epochs
    need not run it again (on the MiniLM QA demo its forward is 40 % of a student step). For tasks whose
    inputs are the same every epoch (not fill-mask's fresh masks) and whose logits are small (not a language
    model's vocabulary at every token). Rows are keyed by their unpadded inputs, so batches may be shuffled
    and padded differently from one epoch to the next.
    """

    def __init__(self, pad_logit: float | None = None) -> None:
        # pad_logit: logits per token ([..., L], padding set to it) are kept unpadded and padded again to
        # each batch's width; None: one logit vector per example.
        self.pad_logit = pad_logit
        self.rows: dict[bytes, torch.Tensor] = {}

    def logits(self, inputs: Batch, run_teacher: Callable[[], torch.Tensor]) -> torch.Tensor:
        """The batch's teacher logits: from memory when every row was seen, else `run_teacher()` (kept)."""
        lengths = inputs["attention_mask"].sum(dim=1).tolist()
        host = {name: inputs[name].cpu().numpy() for name in sorted(inputs)}
        keys = [b"".join(v[row, :n].tobytes() for v in host.values()) for row, n in enumerate(lengths)]
        if all(key in self.rows for key in keys):
            return self._assemble([self.rows[key] for key in keys], int(inputs["attention_mask"].size(1)))
        logits = run_teacher()
        for row, (key, n) in enumerate(zip(keys, lengths, strict=True)):
            kept = logits[row, ..., :n] if self.pad_logit is not None else logits[row]
            self.rows[key] = kept.detach().clone()  # a copy: a view would keep the whole batch alive
        return logits

    def _assemble(self, rows: list[torch.Tensor], width: int) -> torch.Tensor:
        if self.pad_logit is None:
            return torch.stack(rows)
        batch = rows[0].new_full((len(rows), *rows[0].shape[:-1], width), self.pad_logit)
        for row, kept in enumerate(rows):
            batch[row, ..., : kept.size(-1)] = kept
        return batch


def distill_step(
    config: DistillConfig,
    targets: Targets = logits_and_labels,
    alignment: HiddenAlignment | None = None,
    memo: TeacherMemo | None = None,
) -> StepFn:
    """A step that matches the frozen teacher's softened outputs and the hard labels (and, with an
    alignment and alpha_hidden > 0, the teacher's hidden states). With a memo, the teacher's logits of an
    example come from memory after its first epoch; an alignment, which needs the teacher's hidden states
    every step, turns the memo off."""
    align = alignment if config.alpha_hidden > 0 else None
    memo = memo if align is None else None

    def step(student: nn.Module, batch: Batch, teacher: nn.Module | None) -> LossTerms:
        if teacher is None:
            raise ValueError("distillation needs a teacher")
        inputs = model_inputs(batch)
        teacher_out: Any = None

        def run_teacher() -> torch.Tensor:
            nonlocal teacher_out
            with torch.no_grad():
                teacher_out = teacher(**inputs, output_hidden_states=align is not None)
            return targets(teacher_out, batch)[0]

        teacher_logits = memo.logits(inputs, run_teacher) if memo is not None else run_teacher()
        student_out = student(**inputs, output_hidden_states=align is not None)
        logits, labels = targets(student_out, batch)
        terms = distillation_loss(
            logits,
            teacher_logits,
            labels,
            temperature=config.temperature,
            alpha_kd=config.alpha_kd,
            alpha_hard=config.alpha_hard,
        )
        if align is None:
            return terms
        hidden = align.loss(student_out.hidden_states, teacher_out.hidden_states, batch["attention_mask"])
        return terms._replace(total=terms.total + config.alpha_hidden * hidden, hidden=hidden)

    return step
