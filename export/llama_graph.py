"""Llama decoders written as ONNX node by node: the appending graph of appending_decoder.py (same inputs and
outputs, `present` only the new positions) in a tenth of the nodes.

Traced through torch.onnx, a Llama layer became ~90 nodes after ONNX Runtime's fusions, most of them shape
arithmetic (Shape, Gather, Unsqueeze, Concat) that every `view` and `rotate_half` re-derives per layer; on a
CPU each node costs a dispatch, and they were over half of a 12-layer draft's decode step (SmolLM2's student,
batch 1: its 8-bit matrix multiplies 45 % of the kernel time). Here each layer is ~35 nodes, the shapes
computed once per call and the rest ONNX Runtime's fused operators:

    (x, h) = SkipSimplifiedLayerNormalization(out, h)       residual add + RMSNorm in one
    q, k, v = Split(x @ W_qkv)                              one matrix multiply for the three projections
    q, k = RotaryEmbedding(q), RotaryEmbedding(k)           cos/sin tables from the model's own rotary module
    scores = [FusedMatMul(q, past_k) | FusedMatMul(q, k)]   scaled, transposed in the multiply
    out = softmax(where(allowed, scores)) @ [past_v ; v]    as appending_decoder.attend, past never copied
    x @ W_down * (silu(x @ W_gate) * (x @ W_up))            gate and up in one multiply
    logits = GatherND(norm(h), logit_positions) @ W_head    the head at the positions asked for only

The weights are the Hugging Face model's own, transposed once here; a tied output head reads the embedding
table through a Transpose, which ONNX Runtime folds at load and the int8 recipes see as tied, as with the
traced graph. Models this graph does not cover (a rope that depends on the sequence's length, an activation
other than SiLU) are exported the traced way (`fuses`).
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from common.logit_positions import LOGIT_POSITIONS
from export.tasks import decoder_shape

if TYPE_CHECKING:
    from export.onnx_files import WeightsFile

# Ropes whose angle depends on the position only (a table); "dynamic" and "longrope" change with the length.
STATIC_ROPE = ("default", "linear", "llama3", "yarn")
MASKED = float(np.finfo(np.float32).min)  # a masked score, as torch's masked_fill with finfo.min


def fuses(config: Any) -> bool:
    """Whether this Llama config is written by `fused_llama` (else the traced appending graph)."""
    scaling = getattr(config, "rope_scaling", None) or {}
    rope = scaling.get("rope_type", scaling.get("type", "default"))
    return (
        config.model_type == "llama"
        and getattr(config, "hidden_act", "silu") == "silu"
        and rope in STATIC_ROPE
        and not getattr(config, "mlp_bias", False)
    )


class _Graph:
    """Nodes, initializers and unique names for one ModelProto."""

    def __init__(self, sink: WeightsFile | None = None) -> None:
        from onnx import NodeProto, TensorProto

        self.nodes: list[NodeProto] = []
        self.weights: list[TensorProto] = []
        self.count = 0
        self.sink = sink  # where each weight's bytes go as it is made (None: inside the graph)

    def op(
        self, op_type: str, inputs: list[str], outputs: int | list[str] = 1, domain: str = "", **attrs: Any
    ) -> list[str]:
        """Add a node; `outputs` is a count (named here) or the names ("" for an output not wanted)."""
        from onnx import helper

        self.count += 1
        names = (
            outputs if isinstance(outputs, list) else [f"{op_type}_{self.count}_{i}" for i in range(outputs)]
        )
        self.nodes.append(
            helper.make_node(op_type, inputs, names, name=f"{op_type}_{self.count}", domain=domain, **attrs)
        )
        return names

    def one(self, op_type: str, inputs: list[str], domain: str = "", **attrs: Any) -> str:
        return self.op(op_type, inputs, 1, domain, **attrs)[0]

    def weight(self, name: str, array: np.ndarray) -> str:
        from onnx import numpy_helper

        if self.sink is not None:
            self.weights.append(self.sink.tensor(array, name))
        else:
            self.weights.append(numpy_helper.from_array(np.ascontiguousarray(array), name))
        return name

    def rms_norm(self, x: str, weight: str, eps: float) -> str:
        """x / sqrt(mean(x²) + eps) * weight in standard operators (ONNX Runtime fuses them at load; its
        SimplifiedLayerNormalization is not an ONNX operator, so onnx's checker would refuse the graph)."""
        squares = self.one("Pow", [x, self.weight(f"two_{self.count}", np.array(2.0, np.float32))])
        mean = self.one("ReduceMean", [squares], axes=[-1], keepdims=1)
        eps_name = self.weight(f"eps_{self.count}", np.array(eps, np.float32))
        root = self.one("Sqrt", [self.one("Add", [mean, eps_name])])
        return self.one("Mul", [self.one("Div", [x, root]), weight])

    def skip_norm(self, out: str, residual: str, weight: str, eps: float) -> tuple[str, str]:
        """(RMSNorm(out + residual) * weight, out + residual): the residual add and the next norm in one."""
        normed, _, _, total = self.op(
            "SkipSimplifiedLayerNormalization",
            [out, residual, weight],
            [f"skipnorm_{self.count + 1}", "", "", f"residual_{self.count + 1}"],
            "com.microsoft",
            epsilon=eps,
        )
        return normed, total

    def ints(self, name: str, values: list[int]) -> str:
        return self.weight(name, np.array(values, dtype=np.int64))


def _matrix(linear: Any) -> np.ndarray:
    """A torch Linear's weight as the right operand of x @ W: [in, out], float32."""
    return linear.weight.detach().float().numpy().T


def _vector(norm: Any) -> np.ndarray:
    return norm.weight.detach().float().numpy()


def _bias(linear: Any) -> np.ndarray | None:
    return None if linear.bias is None else linear.bias.detach().float().numpy()


def _rotary_tables(model: Any, head_dim: int) -> tuple[np.ndarray, np.ndarray]:
    """cos and sin per position and frequency, [max positions, head_dim / 2], from the model's own rotary
    module (its scaling rule included); RotaryEmbedding reads the first half (the second repeats it)."""
    import torch

    positions = int(model.config.max_position_embeddings)
    probe = torch.zeros(1, 1, head_dim)
    with torch.no_grad():
        cos, sin = model.model.rotary_emb(probe, torch.arange(positions)[None])
    half = head_dim // 2
    return cos[0, :, :half].float().numpy(), sin[0, :, :half].float().numpy()


def fused_llama(model: Any, sink: WeightsFile | None = None) -> Any:
    """The appending decoder of a LlamaForCausalLM as an onnx.ModelProto (opset 17 + com.microsoft); with
    `sink`, its weights written there as they are made, the graph holding references to them."""
    from onnx import helper

    config, inner = model.config, model.model
    layers, heads, kv_heads, head_dim = decoder_shape(config)
    eps = float(config.rms_norm_eps)
    g = _Graph(sink)
    _per_call(g, model, heads // kv_heads)
    g.ints("kv_shape", [0, 0, kv_heads, head_dim])
    g.ints("q_groups", [0, 0, kv_heads, heads // kv_heads, head_dim])
    g.ints("q_rows", [0, 0, -1, head_dim])
    g.ints("out_groups", [0, 0, heads // kv_heads, -1, head_dim])
    g.ints("merge_heads", [0, 0, -1])
    g.ints("qkv_split", [heads * head_dim, kv_heads * head_dim, kv_heads * head_dim])
    g.ints("mlp_split", [int(config.intermediate_size)] * 2)

    table = g.weight("embed_tokens", inner.embed_tokens.weight.detach().float().numpy())
    h = g.one("Gather", [table, "input_ids"])
    out: str | None = None  # the last block's output, added to the residual stream by the next norm
    for index, layer in enumerate(inner.layers):
        norm_in = g.weight(f"layers.{index}.input_layernorm", _vector(layer.input_layernorm))
        x, h = (g.rms_norm(h, norm_in, eps), h) if out is None else g.skip_norm(out, h, norm_in, eps)
        out = _attention(g, index, layer.self_attn, x, heads, kv_heads)
        norm_post = g.weight(
            f"layers.{index}.post_attention_layernorm", _vector(layer.post_attention_layernorm)
        )
        x, h = g.skip_norm(out, h, norm_post, eps)
        out = _mlp(g, index, layer.mlp, x)
    norm = g.weight("norm", _vector(inner.norm))
    final = g.skip_norm(out, h, norm, eps)[0] if out else g.rms_norm(h, norm, eps)
    # the head scores only the positions asked for (common/logit_positions.py): [B, S, H] -> [B, N, H]
    wanted = g.one("Unsqueeze", [LOGIT_POSITIONS, g.ints("last_axis", [-1])])
    final = g.one("GatherND", [final, wanted], batch_dims=1)
    if model.lm_head.weight.data_ptr() == inner.embed_tokens.weight.data_ptr():
        w_head = g.one("Transpose", [table], perm=[1, 0])  # tied: the table read twice, folded at load
    else:
        w_head = g.weight("lm_head", _matrix(model.lm_head))
    g.nodes.append(helper.make_node("MatMul", [final, w_head], ["logits"], name="lm_head"))
    return _model(g, layers, kv_heads, head_dim, int(config.vocab_size))


def _per_call(g: _Graph, model: Any, groups: int) -> None:
    """What every layer shares, computed once a call: `allowed` (who may attend to whom, [B, 1, G * S,
    P + S], rows group-major as the queries are stacked), `split_scores` ([P, S]: the scores' past and new
    columns), the rotary tables and the masked score."""
    from onnx import TensorProto

    new = g.one("Gather", [g.one("Shape", ["input_ids"]), g.ints("one", [1])])  # [1]: S
    total = g.one("Gather", [g.one("Shape", ["attention_mask"]), "one"])  # [1]: P + S
    past = g.one("Sub", [total, new])
    zero, step = g.weight("zero_scalar", np.array(0, np.int64)), g.weight("one_scalar", np.array(1, np.int64))
    axis0 = g.ints("axis0", [0])
    new_s, total_s = (g.one("Squeeze", [t, axis0]) for t in (new, total))
    rows = g.one("Add", [g.one("Range", [zero, new_s, step]), past])  # each new position's index in the cache
    columns = g.one("Range", [zero, total_s, step])
    causal = g.one(
        "LessOrEqual",
        [g.one("Unsqueeze", [columns, axis0]), g.one("Unsqueeze", [rows, g.ints("axis1", [1])])],
    )  # [S, P + S]
    real = g.one(
        "Unsqueeze", [g.one("Cast", ["attention_mask"], to=TensorProto.BOOL), g.ints("axes12", [1, 2])]
    )
    if groups > 1:
        g.op("Tile", [g.one("And", [causal, real]), g.ints("group_tile", [1, 1, groups, 1])], ["allowed"])
    else:
        g.op("And", [causal, real], ["allowed"])
    g.op("Concat", [past, new], ["split_scores"], axis=0)
    g.weight("masked", np.array(MASKED, np.float32))
    cos, sin = _rotary_tables(model, int(decoder_shape(model.config)[3]))
    g.weight("cos_cache", cos)
    g.weight("sin_cache", sin)


def _attention(g: _Graph, index: int, attn: Any, x: str, heads: int, kv_heads: int) -> str:
    """One layer's attention over (past, new); writes present.{index}.key/value, returns o_proj's output."""
    projections = (attn.q_proj, attn.k_proj, attn.v_proj)
    qkv = g.one(
        "MatMul", [x, g.weight(f"layers.{index}.qkv", np.concatenate([_matrix(p) for p in projections], 1))]
    )
    biases = [_bias(p) for p in projections]
    if any(b is not None for b in biases):
        zeros = [np.zeros(p.weight.shape[0], np.float32) for p in projections]
        full = np.concatenate([b if b is not None else z for b, z in zip(biases, zeros, strict=True)])
        qkv = g.one("Add", [qkv, g.weight(f"layers.{index}.qkv_bias", full)])
    q, k, v = g.op("Split", [qkv, "qkv_split"], 3, axis=-1)
    rotary = ["position_ids", "cos_cache", "sin_cache"]
    q = g.one("RotaryEmbedding", [q, *rotary], "com.microsoft", num_heads=heads, interleaved=0)
    k = g.one("RotaryEmbedding", [k, *rotary], "com.microsoft", num_heads=kv_heads, interleaved=0)
    key, value = f"present.{index}.key", f"present.{index}.value"
    for t, name in ((k, key), (v, value)):  # [B, S, KV * D] -> [B, KV, S, D]
        g.op("Transpose", [g.one("Reshape", [t, "kv_shape"])], [name], perm=[0, 2, 1, 3])
    grouped = heads > kv_heads
    if grouped:  # [B, S, KV, G, D] -> [B, KV, G, S, D] -> [B, KV, G * S, D]
        q = g.one(
            "Reshape",
            [g.one("Transpose", [g.one("Reshape", [q, "q_groups"])], perm=[0, 2, 3, 1, 4]), "q_rows"],
        )
    else:
        q = g.one("Transpose", [g.one("Reshape", [q, "kv_shape"])], perm=[0, 2, 1, 3])
    scale = float(attn.scaling)
    by_past, by_new = (
        g.one("FusedMatMul", [q, keys], "com.microsoft", alpha=scale, transB=1)
        for keys in (f"past_key_values.{index}.key", key)
    )
    scores = g.one("Where", ["allowed", g.one("Concat", [by_past, by_new], axis=-1), "masked"])
    on_past, on_new = g.op("Split", [g.one("Softmax", [scores], axis=-1), "split_scores"], 2, axis=-1)
    attended = g.one(
        "Add",
        [g.one("MatMul", [on_past, f"past_key_values.{index}.value"]), g.one("MatMul", [on_new, value])],
    )
    if grouped:  # back to [B, S, KV, G, D], then [B, S, heads * D]
        attended = g.one("Transpose", [g.one("Reshape", [attended, "out_groups"])], perm=[0, 3, 1, 2, 4])
    else:
        attended = g.one("Transpose", [attended], perm=[0, 2, 1, 3])
    return _linear(g, g.one("Reshape", [attended, "merge_heads"]), attn.o_proj, f"layers.{index}.o_proj")


def _mlp(g: _Graph, index: int, mlp: Any, x: str) -> str:
    """down(silu(gate(x)) * up(x)), gate and up in one multiply."""
    both = np.concatenate([_matrix(mlp.gate_proj), _matrix(mlp.up_proj)], axis=1)
    gate, up = g.op(
        "Split", [g.one("MatMul", [x, g.weight(f"layers.{index}.gate_up", both)]), "mlp_split"], 2, axis=-1
    )
    act = g.one("Mul", [g.one("Mul", [gate, g.one("Sigmoid", [gate])]), up])
    return _linear(g, act, mlp.down_proj, f"layers.{index}.down_proj")


def _linear(g: _Graph, x: str, linear: Any, name: str) -> str:
    y = g.one("MatMul", [x, g.weight(name, _matrix(linear))])
    bias = _bias(linear)
    return y if bias is None else g.one("Add", [y, g.weight(f"{name}.bias", bias)])


def _model(g: _Graph, layers: int, kv_heads: int, head_dim: int, vocab: int) -> Any:
    """The ModelProto: optimum's input and output names, the cache [batch, kv heads, positions, head dim]."""
    from onnx import TensorProto, helper

    cache: list[str | int] = ["batch_size", kv_heads, "past_sequence_length", head_dim]
    inputs = [
        helper.make_tensor_value_info("input_ids", TensorProto.INT64, ["batch_size", "sequence_length"]),
        helper.make_tensor_value_info(
            "attention_mask", TensorProto.INT64, ["batch_size", "past_sequence_length + sequence_length"]
        ),
        helper.make_tensor_value_info("position_ids", TensorProto.INT64, ["batch_size", "sequence_length"]),
        helper.make_tensor_value_info(LOGIT_POSITIONS, TensorProto.INT64, ["batch_size", "logit_positions"]),
    ]
    outputs = [
        helper.make_tensor_value_info("logits", TensorProto.FLOAT, ["batch_size", "logit_positions", vocab])
    ]
    for layer in range(layers):
        for kind in ("key", "value"):
            inputs.append(
                helper.make_tensor_value_info(f"past_key_values.{layer}.{kind}", TensorProto.FLOAT, cache)
            )
            outputs.append(
                helper.make_tensor_value_info(
                    f"present.{layer}.{kind}",
                    TensorProto.FLOAT,
                    ["batch_size", kv_heads, "sequence_length", head_dim],
                )
            )
    graph = helper.make_graph(g.nodes, "llama_appending", inputs, outputs, g.weights)
    opsets = [helper.make_opsetid("", 17), helper.make_opsetid("com.microsoft", 1)]
    return helper.make_model(graph, opset_imports=opsets, producer_name="distilserve", ir_version=8)


def export_fused_llama(model: Any, out: Path) -> None:
    """Write `fused_llama(model)` to `out`; weights past one file's 2 GB (a Llama of ~500 M parameters or
    more in fp32) into `out`.data as the graph is built (export/onnx_files.py)."""
    import onnx

    from export import onnx_files

    if sum(p.numel() for p in model.parameters()) * 4 <= onnx_files.ONE_FILE_BYTES:
        onnx_files.save(fused_llama(model), out)
        return
    with onnx_files.WeightsFile(onnx_files.data_path(out)) as sink:
        graph = fused_llama(model, sink)
    onnx.save(graph, str(out))
