"""A GPT-2 decoder graph whose cache the caller keeps: `present` holds only the positions fed in.

optimum's graph concatenates past and new keys/values inside every call and returns the whole cache, so a
decode step copies the entire cache (and once more for the transposed keys) to produce one position: on the
demo LM, a batch of 16 at 100 cached positions took 2.4 ms a step against 1.0 ms at 4. Here attention reads
the past where it lies and scores the new positions beside it:

    scores = [q · past_kᵀ | q · kᵀ]   (masked, softmax over both)   out = p_past · past_v + p_new · v

and only the new keys and values come out; the runner writes them into a cache it preallocates and grows
in chunks. Everything but attention is the Hugging Face model's own modules, so the numerics are its own.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch
from torch import nn


class AppendingAttention(nn.Module):
    """GPT-2 self-attention over (past, new) without concatenating the past."""

    def __init__(self, attn: Any) -> None:
        super().__init__()
        self.c_attn, self.c_proj = attn.c_attn, attn.c_proj
        self.heads, self.head_dim = attn.num_heads, attn.head_dim
        scale = attn.head_dim**0.5 if attn.scale_attn_weights else 1.0
        if attn.scale_attn_by_inverse_layer_idx:
            scale *= float(attn.layer_idx + 1)
        self.scale = scale

    def forward(
        self, x: torch.Tensor, past_k: torch.Tensor, past_v: torch.Tensor, allowed: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        batch, length, width = x.shape
        q, k, v = (
            t.view(batch, length, self.heads, self.head_dim).transpose(1, 2)
            for t in self.c_attn(x).split(width, dim=2)
        )
        past_length = past_k.shape[2]
        scores = torch.cat([q @ past_k.transpose(-1, -2), q @ k.transpose(-1, -2)], dim=-1) / self.scale
        scores = scores.masked_fill(~allowed, torch.finfo(scores.dtype).min)
        probs = scores.softmax(dim=-1)
        out = probs[..., :past_length] @ past_v + probs[..., past_length:] @ v
        out = out.transpose(1, 2).reshape(batch, length, width)
        return self.c_proj(out), k, v


class AppendingGPT2(nn.Module):
    """GPT2LMHeadModel's forward for one step, with the appending attention; inputs as optimum names them."""

    def __init__(self, model: Any) -> None:
        super().__init__()
        transformer = model.transformer
        self.wte, self.wpe, self.ln_f, self.lm_head = (
            transformer.wte,
            transformer.wpe,
            transformer.ln_f,
            model.lm_head,
        )
        self.blocks = nn.ModuleList(transformer.h)
        self.attentions = nn.ModuleList(AppendingAttention(block.attn) for block in transformer.h)

    def forward(
        self,
        input_ids: torch.Tensor,
        attention_mask: torch.Tensor,
        position_ids: torch.Tensor,
        *past: torch.Tensor,  # keys and values, layer by layer: [batch, heads, past positions, head_dim]
    ) -> tuple[torch.Tensor, ...]:
        length = input_ids.shape[1]
        past_length = past[0].shape[2]
        # Who may attend to whom: every real past position, and the new ones causally, minus padding.
        causal = torch.ones(length, length, dtype=torch.bool, device=input_ids.device).tril()
        seen = torch.ones(length, past_length, dtype=torch.bool, device=input_ids.device)
        allowed = torch.cat([seen, causal], dim=1)[None, None] & attention_mask.bool()[:, None, None, :]
        h = self.wte(input_ids) + self.wpe(position_ids)
        presents: list[torch.Tensor] = []
        blocks: list[Any] = list(self.blocks)  # Hugging Face's GPT2Block: its ln_1, ln_2 and mlp
        for layer, (block, attention) in enumerate(zip(blocks, self.attentions, strict=True)):
            attended, k, v = attention(block.ln_1(h), past[2 * layer], past[2 * layer + 1], allowed)
            h = h + attended
            h = h + block.mlp(block.ln_2(h))
            presents += [k, v]
        return (self.lm_head(self.ln_f(h)), *presents)


def export_appending_decoder(model: Any, out: Path, opset: int) -> None:
    """Write the appending decoder of a GPT2LMHeadModel to `out` with the names optimum's graph uses."""
    config = model.config
    layers, heads = config.n_layer, config.n_head
    head_dim = config.n_embd // heads
    names_in = ["input_ids", "attention_mask", "position_ids"]
    names_out = ["logits"]
    dynamic: dict[str, dict[int, str]] = {
        "input_ids": {0: "batch_size", 1: "sequence_length"},
        "attention_mask": {0: "batch_size", 1: "past_sequence_length + sequence_length"},
        "position_ids": {0: "batch_size", 1: "sequence_length"},
        "logits": {0: "batch_size", 1: "sequence_length"},
    }
    for layer in range(layers):
        for kind in ("key", "value"):
            past, present = f"past_key_values.{layer}.{kind}", f"present.{layer}.{kind}"
            names_in.append(past)
            names_out.append(present)
            dynamic[past] = {0: "batch_size", 2: "past_sequence_length"}
            dynamic[present] = {0: "batch_size", 2: "sequence_length"}
    batch, length, past_length = 2, 3, 4
    example = (
        torch.ones(batch, length, dtype=torch.int64),
        torch.ones(batch, past_length + length, dtype=torch.int64),
        torch.arange(past_length, past_length + length).repeat(batch, 1),
        *(torch.zeros(batch, heads, past_length, head_dim) for _ in range(2 * layers)),
    )
    # eval() on the wrapper itself: the exporter restores the wrapper's mode afterwards, recursively, and a
    # fresh Module is in training mode, which would leave the caller's model with dropout switched on.
    with torch.no_grad():
        torch.onnx.export(
            AppendingGPT2(model).eval(),
            example,
            str(out),
            input_names=names_in,
            output_names=names_out,
            dynamic_axes=dynamic,
            opset_version=opset,
            dynamo=False,
            # Folding would write the tied output head as a transposed copy of the embedding table, and
            # int8 would then quantize the table it no longer sees shared (ORT folds it when loading).
            do_constant_folding=False,
        )
