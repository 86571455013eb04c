"""The distillation and hidden-alignment losses against hand-computed values, scaling and masking."""

from __future__ import annotations

import math

import pytest
import torch

from training.losses import distillation_loss, hard_loss, hidden_alignment_loss


def _softmax(row: list[float], temperature: float = 1.0) -> list[float]:
    exps = [math.exp(x / temperature) for x in row]
    return [e / sum(exps) for e in exps]


def _kl(p: list[float], q: list[float]) -> float:
    return sum(pi * (math.log(pi) - math.log(qi)) for pi, qi in zip(p, q, strict=True))


STUDENT = [[1.0, 2.0, 3.0], [0.5, 0.0, -1.0]]
TEACHER = [[3.0, 1.0, 0.0], [0.0, 2.0, 0.0]]
LABELS = [2, 1]


def test_toy_case_matches_hand_computation() -> None:
    t = 2.0
    kd = (
        t**2 * sum(_kl(_softmax(te, t), _softmax(st, t)) for st, te in zip(STUDENT, TEACHER, strict=True)) / 2
    )
    hard = -sum(math.log(_softmax(st)[y]) for st, y in zip(STUDENT, LABELS, strict=True)) / 2

    terms = distillation_loss(
        torch.tensor(STUDENT),
        torch.tensor(TEACHER),
        torch.tensor(LABELS),
        temperature=t,
        alpha_kd=0.7,
        alpha_hard=0.3,
    )

    assert terms.kd.item() == pytest.approx(kd, rel=1e-5)
    assert terms.hard.item() == pytest.approx(hard, rel=1e-5)
    assert terms.total.item() == pytest.approx(0.7 * kd + 0.3 * hard, rel=1e-5)


@pytest.mark.parametrize("temperature", [1.0, 2.0, 5.0])
def test_kd_is_t_squared_times_softened_kl(temperature: float) -> None:
    kl = sum(
        _kl(_softmax(te, temperature), _softmax(st, temperature))
        for st, te in zip(STUDENT, TEACHER, strict=True)
    )
    terms = distillation_loss(
        torch.tensor(STUDENT),
        torch.tensor(TEACHER),
        torch.tensor(LABELS),
        temperature=temperature,
        alpha_kd=1.0,
        alpha_hard=0.0,
    )
    assert terms.kd.item() == pytest.approx(temperature**2 * kl / 2, rel=1e-5)
    assert terms.total.item() == pytest.approx(terms.kd.item())


def test_identical_logits_give_zero_kd() -> None:
    logits = torch.randn(4, 5)
    terms = distillation_loss(
        logits,
        logits.clone(),
        torch.zeros(4, dtype=torch.long),
        temperature=3.0,
        alpha_kd=1.0,
        alpha_hard=1.0,
    )
    assert terms.kd.item() == pytest.approx(0.0, abs=1e-6)


def test_token_level_logits_average_over_labelled_positions_only() -> None:
    torch.manual_seed(0)
    student, teacher = torch.randn(2, 4, 7), torch.randn(2, 4, 7)
    labels = torch.tensor([[1, -100, 3, -100], [-100, 6, -100, -100]])
    keep = labels != -100

    full = distillation_loss(student, teacher, labels, temperature=2.0, alpha_kd=0.5, alpha_hard=0.5)
    kept_only = distillation_loss(
        student[keep], teacher[keep], labels[keep], temperature=2.0, alpha_kd=0.5, alpha_hard=0.5
    )
    assert full.kd.item() == pytest.approx(kept_only.kd.item(), rel=1e-6)
    assert full.hard.item() == pytest.approx(kept_only.hard.item(), rel=1e-6)

    noisy_student, noisy_teacher = student.clone(), teacher.clone()
    noisy_student[~keep] += 100.0
    noisy_teacher[~keep] -= 100.0
    noisy = distillation_loss(
        noisy_student, noisy_teacher, labels, temperature=2.0, alpha_kd=0.5, alpha_hard=0.5
    )
    assert noisy.total.item() == pytest.approx(full.total.item(), rel=1e-6)


def test_all_ignored_gives_zero_not_nan() -> None:
    labels = torch.full((2, 3), -100)
    terms = distillation_loss(
        torch.randn(2, 3, 5), torch.randn(2, 3, 5), labels, temperature=2.0, alpha_kd=0.5, alpha_hard=0.5
    )
    assert terms.total.item() == 0.0
    assert hard_loss(torch.randn(2, 3, 5), labels).total.item() == 0.0


def test_gradients_reach_the_student_only() -> None:
    student = torch.randn(3, 4, requires_grad=True)
    teacher = torch.randn(3, 4, requires_grad=True)
    distillation_loss(
        student, teacher, torch.tensor([0, 1, 2]), temperature=2.0, alpha_kd=1.0, alpha_hard=1.0
    ).total.backward()
    assert student.grad is not None and student.grad.abs().sum() > 0
    assert teacher.grad is None  # soft targets are detached


def test_hard_loss_is_cross_entropy() -> None:
    logits, labels = torch.tensor(STUDENT), torch.tensor(LABELS)
    expected = torch.nn.functional.cross_entropy(logits, labels).item()
    terms = hard_loss(logits, labels)
    assert terms.total.item() == pytest.approx(expected, rel=1e-6)
    assert terms.kd.item() == 0.0


def test_mismatched_shapes_are_rejected() -> None:
    with pytest.raises(ValueError, match="student logits"):
        distillation_loss(
            torch.randn(2, 3),
            torch.randn(2, 4),
            torch.tensor([0, 1]),
            temperature=1.0,
            alpha_kd=1.0,
            alpha_hard=0.0,
        )
    with pytest.raises(ValueError, match="temperature"):
        distillation_loss(
            torch.randn(2, 3),
            torch.randn(2, 3),
            torch.tensor([0, 1]),
            temperature=0.0,
            alpha_kd=1.0,
            alpha_hard=0.0,
        )


# --------------------------------------------------------------------------- hidden-state alignment

# One sequence of three 2-d hidden states; the third token is padding (mask 0) and must not count.
S_HIDDEN = [[[1.0, 0.0], [0.0, 1.0], [1.0, 1.0]]]
T_HIDDEN = [[[3.0, 0.0], [2.0, 0.0], [-50.0, 80.0]]]
MASK = [[1, 1, 0]]


def test_hidden_cosine_matches_hand_computation() -> None:
    # token 0: same direction -> 1 - 1 = 0; token 1: orthogonal -> 1 - 0 = 1; mean over 2 real tokens.
    loss = hidden_alignment_loss(torch.tensor(S_HIDDEN), torch.tensor(T_HIDDEN), torch.tensor(MASK), "cosine")
    assert loss.item() == pytest.approx(0.5, rel=1e-6)


def test_hidden_mse_matches_hand_computation() -> None:
    # token 0: ((1-3)² + 0²) / 2 = 2; token 1: ((0-2)² + 1²) / 2 = 2.5; mean 2.25.
    loss = hidden_alignment_loss(torch.tensor(S_HIDDEN), torch.tensor(T_HIDDEN), torch.tensor(MASK), "mse")
    assert loss.item() == pytest.approx(2.25, rel=1e-6)


def test_hidden_loss_ignores_padding_and_averages_layers() -> None:
    torch.manual_seed(0)
    student, teacher = torch.randn(2, 3, 5, 4), torch.randn(2, 3, 5, 4)  # 2 layers, B=3, L=5, H=4
    mask = torch.tensor([[1, 1, 1, 0, 0], [1, 1, 1, 1, 1], [1, 0, 0, 0, 0]])
    for kind in ("cosine", "mse"):
        both = hidden_alignment_loss(student, teacher, mask, kind)
        per_layer = [hidden_alignment_loss(student[i], teacher[i], mask, kind) for i in range(2)]
        assert both.item() == pytest.approx(sum(p.item() for p in per_layer) / 2, rel=1e-5)
        noisy = teacher.clone()
        noisy[:, mask == 0] += 100.0
        assert hidden_alignment_loss(student, noisy, mask, kind).item() == pytest.approx(
            both.item(), rel=1e-6
        )


def test_hidden_loss_projects_a_narrower_student_and_trains_only_the_student_side() -> None:
    torch.manual_seed(0)
    projection = torch.nn.Linear(2, 3)
    student = torch.randn(1, 4, 2, requires_grad=True)
    teacher = torch.randn(1, 4, 3, requires_grad=True)
    mask = torch.ones(1, 4, dtype=torch.long)
    loss = hidden_alignment_loss(student, teacher, mask, "mse", projection)
    expected = (projection(student) - teacher).pow(2).mean()
    assert loss.item() == pytest.approx(expected.item(), rel=1e-6)
    loss.backward()
    assert student.grad is not None and projection.weight.grad is not None
    assert teacher.grad is None  # the teacher is a target
    with pytest.raises(ValueError, match="projection"):
        hidden_alignment_loss(student, teacher, mask, "cosine")
    with pytest.raises(ValueError, match="cosine"):
        hidden_alignment_loss(student, teacher, mask, "l1", projection)  # type: ignore[arg-type]
