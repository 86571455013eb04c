"""Where a causal LM keeps its in-context circuits, so that a student cut from it keeps them too.

A transformer copies from its context with two heads in different layers: a previous-token head (position j
looks at j - 1) writes "what came before me" into the residual stream, and a later induction head looks for
an earlier occurrence of the current token and reads what followed it. Both are found by feeding random
tokens twice: on the repeat, an induction head at position span + i attends to i + 1.

Why it matters for distillation: a student given every third layer of SmolLM2-135M (DistilBERT's even
spread) loses the circuit and, however long it is distilled on 256- or 2,048-token blocks, never learns to
copy (loss on the repeat of random tokens 14.4 against the teacher's 2.8); its perplexity hardly improves
with more context (53 -> 50 where the teacher's goes 43 -> 24). The same depth cut through the layers that
hold the circuit copies (4.5) and closes most of that gap (docs/benchmarks.md, "Long context").
"""

from __future__ import annotations

from dataclasses import dataclass
from itertools import pairwise

import torch
from transformers import PreTrainedModel

INDUCTION_MIN = 0.3  # a layer with a head this sure of the induction target holds an induction head
PREVIOUS_TOKEN_MIN = 0.6  # ... of the previous token: a previous-token head


@dataclass(frozen=True)
class CircuitScores:
    """Per layer, its most induction-like and most previous-token-like head's mean attention (0..1)."""

    induction: list[float]
    previous_token: list[float]


def induction_scores(attentions: torch.Tensor, span: int) -> torch.Tensor:
    """[B, H, 2 * span, 2 * span] attention over a sequence repeated once -> [H]: the mean weight each head
    puts, at position span + i of the repeat, on i + 1 (the token that followed this one last time)."""
    queries = torch.arange(span, 2 * span - 1)
    return attentions[:, :, queries, queries - span + 1].mean(dim=(0, 2))


def previous_token_scores(attentions: torch.Tensor) -> torch.Tensor:
    """[B, H, T, T] -> [H]: the mean weight each head puts on the position just before the query."""
    queries = torch.arange(1, attentions.shape[-1])
    return attentions[:, :, queries, queries - 1].mean(dim=(0, 2))


@torch.inference_mode()
def circuit_scores(
    model: PreTrainedModel, span: int = 64, sequences: int = 8, seed: int = 0
) -> CircuitScores:
    """Score every layer of `model` on `sequences` random spans of `span` tokens, each repeated once.

    Tokens are drawn from the upper nine tenths of the vocabulary (the first ids are special or bytes).
    Attention weights need the eager kernel: the model is switched to it and back.
    """
    vocab = int(model.config.vocab_size)
    generator = torch.Generator().manual_seed(seed)
    tokens = torch.randint(vocab // 10, vocab, (sequences, span), generator=generator)
    ids = torch.cat([tokens, tokens], dim=1).to(next(model.parameters()).device)
    kernel = model.config._attn_implementation
    model.set_attn_implementation("eager")
    try:
        attentions = model.eval()(input_ids=ids, output_attentions=True).attentions
    finally:
        model.set_attn_implementation(kernel)
    return CircuitScores(
        induction=[float(induction_scores(a.float(), span).max()) for a in attentions],
        previous_token=[float(previous_token_scores(a.float()).max()) for a in attentions],
    )


def circuit_layer_map(
    scores: CircuitScores,
    student_layers: int,
    induction_min: float = INDUCTION_MIN,
    previous_token_min: float = PREVIOUS_TOKEN_MIN,
) -> list[int]:
    """The teacher layers a `student_layers`-deep student copies, chosen to keep the copying circuit.

    In order, while places are left: the first and the last layer; the layers with an induction head,
    surest first; the layers with a previous-token head before the first of those, surest first (an
    induction head reads what they wrote); then the middle of the widest gap left, until the map is full.
    """
    teacher_layers = len(scores.induction)
    if not 1 <= student_layers <= teacher_layers:
        raise ValueError(f"a student needs 1..{teacher_layers} layers, got {student_layers}")
    chosen: list[int] = [0, teacher_layers - 1][:student_layers]
    by_induction = sorted(range(teacher_layers), key=lambda layer: -scores.induction[layer])
    heads = [layer for layer in by_induction if scores.induction[layer] >= induction_min]
    first_head = min(heads, default=teacher_layers)
    by_previous = sorted(range(first_head), key=lambda layer: -scores.previous_token[layer])
    writers = [layer for layer in by_previous if scores.previous_token[layer] >= previous_token_min]
    for layer in heads + writers:
        if len(chosen) == student_layers:
            break
        if layer not in chosen:
            chosen.append(layer)
    while len(chosen) < student_layers:
        ordered = sorted(chosen)
        low, high = max(pairwise(ordered), key=lambda pair: pair[1] - pair[0])
        chosen.append(round((low + high) / 2))
    return sorted(chosen)
