"""A student's heads taught where to look: its attention matched to its teacher's in the layers it kept.

Why: a student cut through its teacher's copying circuit (training/circuits.py) starts with the teacher's
induction heads, but a loss on next-token logits alone lets them drift, and the distilled SmolLM2 students
stop gaining from their context past ~512 tokens where the teacher keeps gaining (docs/benchmarks.md, "Long
context"). MiniLM's attention transfer, applied to the layers a student kept: each matched head's
distribution over its context pulled towards the teacher head's, KL(teacher || student) per query.

Attention weights come from the eager kernel only (the fused ones never form them): a run with this loss
switches both models to it, and captures the chosen layers' weights with forward hooks, nothing else kept.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from contextlib import contextmanager

import torch
from torch import nn
from transformers import PreTrainedModel


def matched_layers(layer_map: Sequence[int], teacher_layers: Sequence[int]) -> list[tuple[int, int]]:
    """(student layer, teacher layer) for each teacher layer named; each must be one the student kept."""
    missing = [layer for layer in teacher_layers if layer not in layer_map]
    if missing:
        raise ValueError(
            f"teacher layers {missing} are not in the student's layer map {list(layer_map)}: "
            "attention is matched only where the student copied the teacher's layer"
        )
    return [(layer_map.index(layer), layer) for layer in teacher_layers]


def attention_modules(model: PreTrainedModel, layers: Sequence[int]) -> list[nn.Module]:
    """The self-attention of each decoder layer named, in a Llama-family model (a decoder stack at
    `model.layers` whose attention returns its weights): other architectures are refused, not guessed at."""
    stack = getattr(getattr(model, "model", None), "layers", None)
    if not isinstance(stack, nn.ModuleList) or not all(hasattr(layer, "self_attn") for layer in stack):
        raise ValueError(
            f"attention transfer supports Llama-family decoders (model.layers[i].self_attn), not "
            f"{type(model).__name__}"
        )
    if any(not 0 <= layer < len(stack) for layer in layers):
        raise ValueError(f"layers {list(layers)}: {type(model).__name__} has layers 0..{len(stack) - 1}")
    modules: list[nn.Module] = [getattr(stack[layer], "self_attn") for layer in layers]  # noqa: B009
    return modules


@contextmanager
def recorded_attention(model: PreTrainedModel, layers: Sequence[int]) -> Iterator[dict[int, torch.Tensor]]:
    """While open, each forward pass puts layer i's attention weights [B, heads, queries, keys] at [i]."""
    modules = attention_modules(model, layers)
    kernel = model.config._attn_implementation
    model.set_attn_implementation("eager")
    weights: dict[int, torch.Tensor] = {}
    handles = []
    for index, module in zip(layers, modules, strict=True):

        def keep(
            _module: nn.Module, _inputs: object, output: tuple[torch.Tensor, ...], index: int = index
        ) -> None:
            weights[index] = output[1]

        handles.append(module.register_forward_hook(keep))
    try:
        yield weights
    finally:
        for handle in handles:
            handle.remove()
        model.set_attn_implementation(kernel)


def attention_kl(teacher: torch.Tensor, student: torch.Tensor) -> torch.Tensor:
    """Mean over batch, heads and queries of KL(teacher || student) over the keys, in float32.

    Masked keys (the future, where the teacher's weight is 0) add nothing; a student weight of 0 where the
    teacher's is not is floored rather than made infinite (bf16 softmax can underflow)."""
    teacher, student = teacher.float(), student.float()
    tiny = torch.finfo(torch.float32).tiny
    terms = torch.where(
        teacher > 0, teacher * (teacher.clamp_min(tiny).log() - student.clamp_min(tiny).log()), 0.0
    )
    return terms.sum(-1).mean()


def attention_loss(
    student: PreTrainedModel,
    teacher: PreTrainedModel,
    input_ids: torch.Tensor,
    pairs: Sequence[tuple[int, int]],
) -> tuple[torch.Tensor, torch.Tensor]:
    """One forward pass of each model on `input_ids`: the student's logits, and the mean attention KL over
    `pairs` (student layer, teacher layer). The student's pass carries the gradient; the teacher's none."""
    with recorded_attention(teacher, [t for _, t in pairs]) as taught, torch.no_grad():
        teacher(input_ids=input_ids)
    with recorded_attention(student, [s for s, _ in pairs]) as learnt:
        logits = student(input_ids=input_ids).logits
    loss = torch.stack([attention_kl(taught[t], learnt[s]) for s, t in pairs]).mean()
    return logits, loss
