"""The distillation losses: pure functions of logits, labels, hidden states, masks and weights.

`distillation_loss` works for any task whose model ends in logits over a last dimension: class logits
[B, C], start/end logits [B, L], masked-token or next-token logits [B, L, V]. Positions whose label is
`ignore_index` count in neither term, so padding and unmasked tokens never pull the student.
`hidden_alignment_loss` pulls the student's hidden states towards the teacher's, over real tokens only.
"""

from __future__ import annotations

from typing import Literal, NamedTuple

import torch
import torch.nn as nn
import torch.nn.functional as F


class LossTerms(NamedTuple):
    """`total` is what backpropagates; the terms are kept apart so they can be logged.

    `hidden` is the (unweighted) hidden-state alignment term, None when the run does not align; `attention`
    the (unweighted) attention-transfer term (training/attention_transfer.py), None without it.
    """

    total: torch.Tensor
    kd: torch.Tensor
    hard: torch.Tensor
    hidden: torch.Tensor | None = None
    attention: torch.Tensor | None = None


def distillation_loss(
    student_logits: torch.Tensor,
    teacher_logits: torch.Tensor,
    labels: torch.Tensor,
    *,
    temperature: float,
    alpha_kd: float,
    alpha_hard: float,
    ignore_index: int = -100,
) -> LossTerms:
    """alpha_kd * T² · KL(p_teacher,T ‖ p_student,T) + alpha_hard * CE(student, labels).

    Both terms are means over the kept positions (per example for [B, C] logits, per labelled token for
    [B, L, V]). The T² factor keeps the soft-target gradients on the same scale as the hard ones whatever
    the temperature (Hinton et al., 2015). Computed in float32 so mixed-precision logits stay stable.
    """
    if student_logits.shape != teacher_logits.shape:
        raise ValueError(
            f"student logits {tuple(student_logits.shape)} != teacher {tuple(teacher_logits.shape)}"
        )
    if temperature <= 0:
        raise ValueError(f"temperature must be > 0, got {temperature}")
    num_classes = student_logits.size(-1)
    student = student_logits.reshape(-1, num_classes).float()
    teacher = teacher_logits.detach().reshape(-1, num_classes).float()  # targets, never trained here
    targets = labels.reshape(-1)
    if targets.numel() != student.size(0):
        raise ValueError(f"labels {tuple(labels.shape)} do not match logits {tuple(student_logits.shape)}")

    keep = targets != ignore_index
    count = keep.sum().clamp(min=1)  # all positions ignored -> both terms are 0, not NaN

    log_p_student = F.log_softmax(student[keep] / temperature, dim=-1)
    log_p_teacher = F.log_softmax(teacher[keep] / temperature, dim=-1)
    kl = F.kl_div(log_p_student, log_p_teacher, reduction="sum", log_target=True)
    kd = kl / count * temperature**2

    hard = F.cross_entropy(student, targets, ignore_index=ignore_index, reduction="sum") / count
    return LossTerms(total=alpha_kd * kd + alpha_hard * hard, kd=kd, hard=hard)


def hard_loss(logits: torch.Tensor, labels: torch.Tensor, *, ignore_index: int = -100) -> LossTerms:
    """Plain cross-entropy (teacher training), as LossTerms so the trainer logs both paths alike."""
    targets = labels.reshape(-1)
    count = (targets != ignore_index).sum().clamp(min=1)
    flat = logits.reshape(-1, logits.size(-1)).float()
    hard = F.cross_entropy(flat, targets, ignore_index=ignore_index, reduction="sum") / count
    return LossTerms(total=hard, kd=torch.zeros_like(hard), hard=hard)


def hidden_alignment_loss(
    student_hidden: torch.Tensor,
    teacher_hidden: torch.Tensor,
    attention_mask: torch.Tensor,
    kind: Literal["cosine", "mse"],
    projection: nn.Module | None = None,
) -> torch.Tensor:
    """Distance between student and teacher hidden states, averaged over real tokens (mask 1).

    Hidden states are [..., B, L, H] (leading dims: aligned layer pairs, averaged too), the mask is [B, L].
    `projection` (e.g. a trained nn.Linear) maps a narrower student to the teacher's width first.
    cosine: 1 - cos(student, teacher) per token, so direction matters and scale does not (DistilBERT);
    mse: mean over features of the squared difference per token (TinyBERT), which also matches scale.
    """
    student = student_hidden.float() if projection is None else projection(student_hidden).float()
    teacher = teacher_hidden.detach().float()
    if student.shape != teacher.shape:
        raise ValueError(
            f"student hidden {tuple(student.shape)} != teacher {tuple(teacher.shape)}"
            + ("" if projection is not None else ": pass a projection when the widths differ")
        )
    if kind == "cosine":
        per_token = 1.0 - F.cosine_similarity(student, teacher, dim=-1)
    elif kind == "mse":
        per_token = (student - teacher).pow(2).mean(-1)
    else:
        raise ValueError(f"hidden loss must be 'cosine' or 'mse', got {kind!r}")
    weights = attention_mask.to(per_token.dtype).expand_as(per_token)
    return (per_token * weights).sum() / weights.sum().clamp(min=1)


def top_k_distillation_loss(
    student_logits: torch.Tensor,
    teacher_values: torch.Tensor,
    teacher_indices: torch.Tensor,
    labels: torch.Tensor,
    *,
    temperature: float,
    alpha_kd: float,
    alpha_hard: float,
    teacher_mass: torch.Tensor | None = None,
    ignore_index: int = -100,
) -> LossTerms:
    """`distillation_loss` when only the teacher's k largest logits are known (a cache of them).

    Student logits are [..., V], teacher values and indices [..., k]. Without `teacher_mass` the teacher's
    distribution is its top k renormalised at temperature T, and the student's full softmax is read at those k
    ids: kd = T² · Σ p_t (log p_t - log q_s). That pulls all of the student's mass into the teacher's top k,
    which the teacher itself does not do (SmolLM2 leaves 16 % of its probability outside its top 64 on
    WikiText-2, median 12 %), so the student grows overconfident on them and pays on every token outside them
    (v7 + 60 steps of KD alone: 0.56 nats more on those tokens, perplexity 40.5 against 38.0 with the rest
    kept; docs/benchmarks.md).

    `teacher_mass` [...] (the teacher's probability on its k ids at T = 1, which the cache records) makes the
    rest of the vocabulary one more class: kd = Σ p_i (log p_i - log q_i) + r (log r - log q_rest), p_i the
    teacher's true probabilities, r = 1 - Σ p_i, q_rest the student's mass outside the k ids. That is the
    exact KL between the two distributions coarsened to k + 1 classes, and the full KL when k is the
    vocabulary. Means over kept positions, computed in float32.
    """
    if (
        teacher_values.shape != teacher_indices.shape
        or teacher_values.shape[:-1] != student_logits.shape[:-1]
    ):
        raise ValueError(
            f"teacher top-k {tuple(teacher_values.shape)}/{tuple(teacher_indices.shape)} do not match "
            f"student logits {tuple(student_logits.shape)}"
        )
    if temperature <= 0:
        raise ValueError(f"temperature must be > 0, got {temperature}")
    vocab, k = student_logits.size(-1), teacher_values.size(-1)
    student = student_logits.reshape(-1, vocab).float()
    values = teacher_values.detach().reshape(-1, k).float()
    indices = teacher_indices.reshape(-1, k)
    targets = labels.reshape(-1)
    keep = targets != ignore_index
    count = keep.sum().clamp(min=1)

    if teacher_mass is None:
        log_q = F.log_softmax(student[keep] / temperature, dim=-1).gather(-1, indices[keep])
        log_p = F.log_softmax(values[keep] / temperature, dim=-1)
        kd = (log_p.exp() * (log_p - log_q)).sum() / count * temperature**2
    else:
        if temperature != 1:
            raise ValueError(
                f"the teacher's mass outside its top k is known at temperature 1, not {temperature}"
            )
        kd = (
            _kd_with_the_rest(student[keep], values[keep], indices[keep], teacher_mass.reshape(-1)[keep])
            / count
        )

    hard = F.cross_entropy(student, targets, ignore_index=ignore_index, reduction="sum") / count
    return LossTerms(total=alpha_kd * kd + alpha_hard * hard, kd=kd, hard=hard)


def _kd_with_the_rest(
    student: torch.Tensor, values: torch.Tensor, indices: torch.Tensor, mass: torch.Tensor
) -> torch.Tensor:
    """Σ over positions of KL(teacher ‖ student) on the teacher's k ids plus one class for the rest."""
    mass = mass.float().clamp(0.0, 1.0)
    log_p = F.log_softmax(values, dim=-1) + torch.log(mass.clamp(min=1e-30)).unsqueeze(-1)
    log_norm = torch.logsumexp(student, dim=-1, keepdim=True)
    log_q = student.gather(-1, indices) - log_norm
    # the k ids masked with a finite floor: with k = V the rest is empty, r = 0, and no inf reaches backward
    outside = student.scatter(-1, indices, -1e9)
    log_q_rest = torch.logsumexp(outside, dim=-1) - log_norm.squeeze(-1)
    rest = 1.0 - mass
    kd_top = (log_p.exp() * (log_p - log_q)).sum()
    kd_rest = (torch.xlogy(rest, rest) - rest * log_q_rest).sum()
    return kd_top + kd_rest


class EmbeddingTerms(NamedTuple):
    """The weighted sum that backpropagates and its two (unweighted) distances, for logging."""

    total: torch.Tensor
    mse: torch.Tensor
    cosine: torch.Tensor


def embedding_loss(
    student: torch.Tensor, teacher: torch.Tensor, *, alpha_mse: float = 1.0, alpha_cosine: float = 0.0
) -> EmbeddingTerms:
    """Distance between student and teacher sentence embeddings [B, D], averaged over sentences.

    mse: mean over features of the squared difference, as sentence-transformers' distillation recipe
    (MSELoss towards the teacher's embeddings) computes it; it matches scale as well as direction.
    cosine: 1 - cos(student, teacher), direction only. For L2-normalised embeddings mse = 2 · cosine / D, so
    the two pull the same way and differ in scale (which matters only beside other weighted terms).
    """
    if student.shape != teacher.shape:
        raise ValueError(f"student embeddings {tuple(student.shape)} != teacher {tuple(teacher.shape)}")
    s, t = student.float(), teacher.detach().float()
    mse = (s - t).pow(2).mean()
    cosine = (1.0 - F.cosine_similarity(s, t, dim=-1)).mean()
    return EmbeddingTerms(total=alpha_mse * mse + alpha_cosine * cosine, mse=mse, cosine=cosine)
