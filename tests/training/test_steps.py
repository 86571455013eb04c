"""The shared distillation step: hidden-state alignment (layer pairs, a trained projection, the terms) and
the teacher memo that spares later epochs the teacher's forward."""

from __future__ import annotations

import pytest
import torch
from transformers import BertConfig, BertForMaskedLM, BertForQuestionAnswering, PreTrainedModel

from training.losses import LossTerms
from training.models import make_student
from training.qa import PAD_LOGIT, span_targets
from training.recipes import DistillConfig
from training.steps import TeacherMemo, distill_step, make_alignment, trains_with


def _teacher() -> PreTrainedModel:
    torch.manual_seed(0)
    config = BertConfig(
        vocab_size=40,
        hidden_size=32,
        num_hidden_layers=4,
        num_attention_heads=2,
        intermediate_size=64,
        max_position_embeddings=16,
    )
    return BertForMaskedLM(config).eval()


def _batch() -> dict[str, torch.Tensor]:
    torch.manual_seed(1)
    ids = torch.randint(5, 40, (4, 10))
    mask = torch.ones_like(ids)
    mask[:, 7:] = 0
    labels = ids.masked_fill(torch.rand(ids.shape) > 0.3, -100).masked_fill(mask == 0, -100)
    return {"input_ids": ids, "attention_mask": mask, "labels": labels}


def test_alignment_pairs_copied_layers_or_spreads_a_narrower_student() -> None:
    teacher = _teacher()
    copied = make_student(teacher, 2, [1, 3])
    same = make_alignment(copied, teacher, [1, 3], "cosine")
    assert same.teacher_layers == (1, 3) and same.projection is None

    narrow = make_student(teacher, 3, hidden_size=16)
    spread = make_alignment(narrow, teacher, None, "mse")
    assert spread.teacher_layers == (0, 2, 3)
    assert spread.projection is not None
    assert (spread.projection.in_features, spread.projection.out_features) == (16, 32)


def test_alignment_term_adds_to_the_total_only_when_weighted() -> None:
    teacher, batch = _teacher(), _batch()
    student = make_student(teacher, 2, [0, 3]).eval()  # no dropout: both calls see the same logits
    alignment = make_alignment(student, teacher, [0, 3], "cosine")
    plain = distill_step(DistillConfig(layers=2))(student, batch, teacher)
    assert plain.hidden is None

    config = DistillConfig(layers=2, alpha_kd=0.3, alpha_hard=0.7, alpha_hidden=2.0)
    terms: LossTerms = distill_step(config, alignment=alignment)(student, batch, teacher)
    assert terms.hidden is not None and terms.hidden.item() > 0
    expected = 0.3 * terms.kd + 0.7 * terms.hard + 2.0 * terms.hidden
    assert terms.total.item() == pytest.approx(expected.item(), rel=1e-6)
    assert terms.kd.item() == pytest.approx(plain.kd.item(), rel=1e-6)  # the same logits terms


def test_projection_trains_with_a_narrower_student_and_is_not_saved() -> None:
    teacher, batch = _teacher(), _batch()
    student = make_student(teacher, 2, hidden_size=16)
    alignment = make_alignment(student, teacher, None, "mse")
    assert alignment.projection is not None
    before = alignment.projection.weight.detach().clone()
    step = distill_step(
        DistillConfig(layers=2, alpha_kd=0.0, alpha_hard=0.0, alpha_hidden=1.0), alignment=alignment
    )

    with trains_with(student, alignment):
        optimizer = torch.optim.AdamW(student.parameters(), lr=1e-2)  # what the trainer sees
        losses = []
        for _ in range(15):
            terms = step(student, batch, teacher)
            terms.total.backward()
            optimizer.step()
            optimizer.zero_grad()
            losses.append(terms.total.item())
    assert losses[-1] < 0.7 * losses[0]
    assert not torch.equal(before, alignment.projection.weight)
    assert not hasattr(student, "hidden_projection")
    assert not any(k.startswith("hidden_projection") for k in student.state_dict())


class _Counting(torch.nn.Module):
    """A teacher that counts its forward passes."""

    def __init__(self, inner: torch.nn.Module) -> None:
        super().__init__()
        self.inner, self.calls = inner, 0

    def forward(self, **inputs: torch.Tensor) -> object:
        self.calls += 1
        return self.inner(**inputs)


def _qa_batch(order: list[int], width: int) -> dict[str, torch.Tensor]:
    """Four windows of 6-9 real tokens in the given order, right-padded to `width`."""
    torch.manual_seed(2)
    ids, lengths = torch.randint(5, 40, (4, 9)), [6, 9, 7, 8]
    batch = torch.zeros(4, width, dtype=torch.long)
    mask = torch.zeros(4, width, dtype=torch.long)
    for row, example in enumerate(order):
        batch[row, : lengths[example]] = ids[example, : lengths[example]]
        mask[row, : lengths[example]] = 1
    answers = torch.tensor([[1, 2], [3, 5], [0, 0], [2, 2]])[order]
    return {
        "input_ids": batch,
        "attention_mask": mask,
        "start_positions": answers[:, 0],
        "end_positions": answers[:, 1],
    }


def test_teacher_memo_serves_later_epochs_without_running_the_teacher() -> None:
    """The second epoch shuffles and pads the windows differently, yet gets the teacher's own logits from
    memory: the losses are those of a step that runs the teacher."""
    torch.manual_seed(0)
    config = BertConfig(
        vocab_size=40, hidden_size=32, num_hidden_layers=2, num_attention_heads=2, intermediate_size=64
    )
    teacher = _Counting(BertForQuestionAnswering(config).eval())
    student = make_student(teacher.inner, 1, [0]).eval()
    memoised = distill_step(DistillConfig(layers=1), span_targets, memo=TeacherMemo(pad_logit=PAD_LOGIT))
    live = distill_step(DistillConfig(layers=1), span_targets)

    memoised(student, _qa_batch([0, 1, 2, 3], width=9), teacher)
    assert teacher.calls == 1
    later = _qa_batch([3, 1, 0, 2], width=12)
    remembered = memoised(student, later, teacher)
    assert teacher.calls == 1  # every window was seen: no teacher forward
    fresh = live(student, later, teacher)
    assert teacher.calls == 2
    for a, b in zip(remembered, fresh, strict=True):
        if a is not None:
            assert a.item() == pytest.approx(b.item(), rel=1e-5, abs=1e-6)

    memoised(student, _qa_batch([0, 1, 2, 3], width=9) | {"input_ids": torch.full((4, 9), 7)}, teacher)
    assert teacher.calls == 3  # unseen inputs run the teacher


def test_teacher_memo_is_off_with_hidden_alignment() -> None:
    teacher, batch = _teacher(), _batch()
    counting = _Counting(teacher)
    student = make_student(teacher, 2, [0, 3]).eval()
    config = DistillConfig(layers=2, alpha_hidden=1.0)
    step = distill_step(
        config, alignment=make_alignment(student, teacher, [0, 3], "cosine"), memo=TeacherMemo()
    )
    step(student, batch, counting)
    step(student, batch, counting)
    assert counting.calls == 2  # the hidden states are needed every step
