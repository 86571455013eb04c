"""Decoder graphs whose cache the caller keeps: `present` holds only the positions fed in (GPT-2, Llama).

optimum's graph concatenates past and new keys/values inside every call and returns the whole cache, so a
decode step copies the entire cache (and once more for the transposed keys) to produce one position: on the
demo LM, a batch of 16 at 100 cached positions took 2.4 ms a step against 1.0 ms at 4. Here attention reads
the past where it lies and scores the new positions beside it:

    scores = [q · past_kᵀ | q · kᵀ]   (masked, softmax over both)   out = p_past · past_v + p_new · v

and only the new keys and values come out; the runner writes them into a cache it preallocates and grows
in chunks. With grouped-query attention (Llama: fewer key/value heads than query heads) the queries of one
group are stacked as rows against their shared key/value head, so the cache is never repeated per query
head. Everything but attention is the Hugging Face model's own modules, so the numerics are its own.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch
from torch import nn

from common.logit_positions import LOGIT_POSITIONS
from export.tasks import APPENDING_TYPES, decoder_shape


def attend(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    past_k: torch.Tensor,
    past_v: torch.Tensor,
    allowed: torch.Tensor,
    divisor: float,
    groups: int = 1,
) -> torch.Tensor:
    """Attention of new queries over (past, new) keys without concatenating the past.

    q: [batch, heads, length, head_dim]; k, v: [batch, kv_heads, length, head_dim]; past_*: [batch,
    kv_heads, past, head_dim]; allowed: [batch, 1, length, past + length]. Returns [batch, length, heads *
    head_dim]. `groups` = heads / kv_heads: query head h reads key/value head h // groups, as Hugging
    Face's repeat_kv lays them out.
    """
    batch, heads, length, head_dim = q.shape
    if groups > 1:  # a group's queries stacked as rows against their key/value head: group-major
        q = q.reshape(batch, heads // groups, groups * length, head_dim)
        allowed = allowed.repeat(1, 1, groups, 1)
    past_length = past_k.shape[2]
    scores = torch.cat([q @ past_k.transpose(-1, -2), q @ k.transpose(-1, -2)], dim=-1) / divisor
    scores = scores.masked_fill(~allowed, torch.finfo(scores.dtype).min)
    probs = scores.softmax(dim=-1)
    out = probs[..., :past_length] @ past_v + probs[..., past_length:] @ v
    return out.reshape(batch, heads, length, head_dim).transpose(1, 2).reshape(batch, length, -1)


def at_positions(h: torch.Tensor, logit_positions: torch.Tensor) -> torch.Tensor:
    """h [batch, length, width] at each row's `logit_positions` [batch, n]: [batch, n, width]
    (common/logit_positions.py: the output head scores only the positions a caller uses)."""
    return h.gather(1, logit_positions[..., None].expand(-1, -1, h.shape[-1]))


def allowed_positions(attention_mask: torch.Tensor, length: int, past_length: int) -> torch.Tensor:
    """Who may attend to whom, [batch, 1, length, past + length]: every real past position, and the new
    ones causally, minus padding."""
    device = attention_mask.device
    causal = torch.ones(length, length, dtype=torch.bool, device=device).tril()
    seen = torch.ones(length, past_length, dtype=torch.bool, device=device)
    return torch.cat([seen, causal], dim=1)[None, None] & attention_mask.bool()[:, None, None, :]


class AppendingAttention(nn.Module):
    """GPT-2 self-attention over (past, new) without concatenating the past."""

    def __init__(self, attn: Any) -> None:
        super().__init__()
        self.c_attn, self.c_proj = attn.c_attn, attn.c_proj
        self.heads, self.head_dim = attn.num_heads, attn.head_dim
        divisor = attn.head_dim**0.5 if attn.scale_attn_weights else 1.0
        if attn.scale_attn_by_inverse_layer_idx:
            divisor *= float(attn.layer_idx + 1)
        self.divisor = divisor

    def forward(
        self, x: torch.Tensor, past_k: torch.Tensor, past_v: torch.Tensor, allowed: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        batch, length, width = x.shape
        q, k, v = (
            t.view(batch, length, self.heads, self.head_dim).transpose(1, 2)
            for t in self.c_attn(x).split(width, dim=2)
        )
        return self.c_proj(attend(q, k, v, past_k, past_v, allowed, self.divisor)), k, v


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
        logit_positions: torch.Tensor,
        *past: torch.Tensor,  # keys and values, layer by layer: [batch, heads, past positions, head_dim]
    ) -> tuple[torch.Tensor, ...]:
        allowed = allowed_positions(attention_mask, input_ids.shape[1], past[0].shape[2])
        h = self.wte(input_ids) + self.wpe(position_ids)
        presents: list[torch.Tensor] = []
        blocks: list[Any] = list(self.blocks)  # Hugging Face's GPT2Block: its ln_1, ln_2 and mlp
        for layer, (block, attention) in enumerate(zip(blocks, self.attentions, strict=True)):
            attended, k, v = attention(block.ln_1(h), past[2 * layer], past[2 * layer + 1], allowed)
            h = h + attended
            h = h + block.mlp(block.ln_2(h))
            presents += [k, v]
        return (self.lm_head(at_positions(self.ln_f(h), logit_positions)), *presents)


class AppendingLlamaAttention(nn.Module):
    """Llama self-attention (rotary positions, grouped key/value heads) over (past, new)."""

    def __init__(self, attn: Any, heads: int, kv_heads: int) -> None:
        super().__init__()
        self.q_proj, self.k_proj, self.v_proj, self.o_proj = (
            attn.q_proj,
            attn.k_proj,
            attn.v_proj,
            attn.o_proj,
        )
        self.heads, self.kv_heads, self.head_dim = heads, kv_heads, attn.head_dim
        self.divisor = 1.0 / attn.scaling
        self.groups = heads // kv_heads

    def forward(
        self,
        x: torch.Tensor,
        rotary: tuple[torch.Tensor, torch.Tensor],
        past_k: torch.Tensor,
        past_v: torch.Tensor,
        allowed: torch.Tensor,
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        from transformers.models.llama.modeling_llama import apply_rotary_pos_emb

        batch, length, _ = x.shape
        q = self.q_proj(x).view(batch, length, self.heads, self.head_dim).transpose(1, 2)
        k = self.k_proj(x).view(batch, length, self.kv_heads, self.head_dim).transpose(1, 2)
        v = self.v_proj(x).view(batch, length, self.kv_heads, self.head_dim).transpose(1, 2)
        cos, sin = rotary
        q, k = apply_rotary_pos_emb(q, k, cos, sin)  # keys are cached rotated, as Hugging Face caches them
        attended = attend(q, k, v, past_k, past_v, allowed, self.divisor, self.groups)
        return self.o_proj(attended), k, v


class AppendingLlama(nn.Module):
    """LlamaForCausalLM's forward for one step (RMSNorm, gated MLP, rotary, grouped-query attention, tied
    or separate output head), with the appending attention; the same inputs and outputs as GPT-2's."""

    def __init__(self, model: Any) -> None:
        super().__init__()
        inner, config = model.model, model.config
        self.embed_tokens, self.norm, self.rotary_emb, self.lm_head = (
            inner.embed_tokens,
            inner.norm,
            inner.rotary_emb,
            model.lm_head,
        )
        self.layers = nn.ModuleList(inner.layers)
        self.attentions = nn.ModuleList(
            AppendingLlamaAttention(layer.self_attn, config.num_attention_heads, config.num_key_value_heads)
            for layer in inner.layers
        )

    def forward(
        self,
        input_ids: torch.Tensor,
        attention_mask: torch.Tensor,
        position_ids: torch.Tensor,
        logit_positions: torch.Tensor,
        *past: torch.Tensor,  # keys and values, layer by layer: [batch, kv_heads, past positions, head_dim]
    ) -> tuple[torch.Tensor, ...]:
        allowed = allowed_positions(attention_mask, input_ids.shape[1], past[0].shape[2])
        h = self.embed_tokens(input_ids)
        rotary = self.rotary_emb(h, position_ids)
        presents: list[torch.Tensor] = []
        layers: list[Any] = list(self.layers)  # Hugging Face's LlamaDecoderLayer: its norms and mlp
        for index, (layer, attention) in enumerate(zip(layers, self.attentions, strict=True)):
            attended, k, v = attention(
                layer.input_layernorm(h), rotary, past[2 * index], past[2 * index + 1], allowed
            )
            h = h + attended
            h = h + layer.mlp(layer.post_attention_layernorm(h))
            presents += [k, v]
        return (self.lm_head(at_positions(self.norm(h), logit_positions)), *presents)


def appending_graph(model: Any) -> nn.Module:
    """The appending wrapper of a GPT2LMHeadModel or a LlamaForCausalLM."""
    model_type = model.config.model_type
    if model_type == "gpt2":
        return AppendingGPT2(model)
    if model_type == "llama":
        return AppendingLlama(model)
    raise ValueError(
        f"no appending decoder graph for model type {model_type!r} ({', '.join(APPENDING_TYPES)})"
    )


def export_appending_decoder(model: Any, out: Path, opset: int, traced: bool = False) -> None:
    """Write the appending decoder of `model` to `out` with the names optimum's graph uses: a Llama node by
    node with ONNX Runtime's fused operators where it can (export/llama_graph.py; `traced` forces the
    torch.onnx trace of the modules above, the way every other decoder goes)."""
    from export.llama_graph import export_fused_llama, fuses
    from export.onnx_files import consolidate

    if not traced and fuses(model.config):
        export_fused_llama(model, out)
        return
    layers, _, kv_heads, head_dim = decoder_shape(model.config)
    names_in = ["input_ids", "attention_mask", "position_ids", LOGIT_POSITIONS]
    names_out = ["logits"]
    dynamic: dict[str, dict[int, str]] = {
        "input_ids": {0: "batch_size", 1: "sequence_length"},
        "attention_mask": {0: "batch_size", 1: "past_sequence_length + sequence_length"},
        "position_ids": {0: "batch_size", 1: "sequence_length"},
        LOGIT_POSITIONS: {0: "batch_size", 1: "logit_positions"},
        "logits": {0: "batch_size", 1: "logit_positions"},
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
        torch.tensor([[length - 1]] * batch),
        *(torch.zeros(batch, kv_heads, past_length, head_dim) for _ in range(2 * layers)),
    )
    # eval() on the wrapper itself: the exporter restores the wrapper's mode afterwards, recursively, and a
    # fresh Module is in training mode, which would leave the caller's model with dropout switched on.
    with torch.no_grad():
        torch.onnx.export(
            appending_graph(model).eval(),
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
    consolidate(out)  # past 2 GB torch.onnx writes a file a tensor; the repository keeps one a variant
