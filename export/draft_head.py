"""A draft graph's output head cut to the vocabulary's first tokens plus the contexts' tokens (the contract
and why: common/draft_head.py). Applied to the 8-bit draft (export.variants.build_draft), whose head is one
MatMulNBits over every row of the vocabulary:

    hidden ── MatMulNBits(rows 0 .. n-1) ─────────────────────────────────────────┐
       └──── MatMul( dequantized rows Gather(table, context_token_ids) ᵀ ) ──── Concat ── logits

The first part keeps the prepacked 8-bit kernel over n rows; the second reads only the rows of the ids fed,
from the same 8-bit blocks (so a token scores the same in either part, up to the kernel's int8 activations).
"""

from __future__ import annotations

from typing import Any

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from common.draft_head import CONTEXT_INPUT, HEAD_TOKENS_KEY

LOGITS = "logits"


def restrict_head(model: onnx.ModelProto, head_tokens: int) -> bool:
    """Cut `model`'s head (in place) to ids 0 .. head_tokens - 1 plus the ids fed as CONTEXT_INPUT; False,
    and the graph untouched, where its vocabulary has no more tokens than that."""
    graph = model.graph
    head = next((n for n in graph.node if LOGITS in n.output), None)
    if head is None or head.op_type != "MatMulNBits":
        raise ValueError("the draft's logits do not come from one MatMulNBits (an 8-bit head) to cut")
    attrs = {a.name: helper.get_attribute_value(a) for a in head.attribute}
    if len(head.input) > 3 and head.input[3]:
        raise ValueError("an 8-bit head with zero points: only symmetric blocks are cut")
    rows, k, bits = int(attrs["N"]), int(attrs["K"]), int(attrs["bits"])
    if bits != 8:
        raise ValueError(f"a {bits}-bit head: only 8-bit blocks are cut")
    if head_tokens >= rows:
        return False
    weights = {init.name: init for init in graph.initializer}
    full_blocks, full_scales = weights[head.input[1]], weights[head.input[2]]
    blocks = numpy_helper.to_array(full_blocks)  # [rows, blocks, block bytes]
    stored_scales = numpy_helper.to_array(full_scales)  # [rows, blocks] or flat
    scales = stored_scales.reshape(rows, -1)

    # the first rows: the same kernel, fewer of them
    first = f"{head.name}/first"
    graph.initializer.extend(
        [
            numpy_helper.from_array(blocks[:head_tokens], f"{first}/B"),
            numpy_helper.from_array(
                scales[:head_tokens].reshape((head_tokens, *stored_scales.shape[1:])), f"{first}/scales"
            ),
        ]
    )
    head.input[1], head.input[2] = f"{first}/B", f"{first}/scales"
    for a in head.attribute:
        if a.name == "N":
            a.i = head_tokens
    head.output[0] = f"{first}/logits"

    # the context's rows: gathered from every row's 8-bit blocks, dequantized, multiplied in fp32
    c = f"{head.name}/context"
    table = blocks.reshape(rows, -1)
    graph.initializer.extend(
        [
            numpy_helper.from_array(table, f"{c}/table"),
            numpy_helper.from_array(scales.astype(np.float32), f"{c}/scales"),
            numpy_helper.from_array(np.array(2 ** (bits - 1), dtype=np.float32), f"{c}/zero"),
            # explicit sizes (0: the ids' count, kept): no -1 to infer, which an empty context cannot
            numpy_helper.from_array(np.array([0, *blocks.shape[1:]], dtype=np.int64), f"{c}/blocked"),
            numpy_helper.from_array(np.array([0, table.shape[1]], dtype=np.int64), f"{c}/flat"),
            numpy_helper.from_array(np.array([0], dtype=np.int64), f"{c}/start"),
            numpy_helper.from_array(np.array([k], dtype=np.int64), f"{c}/k"),
            numpy_helper.from_array(np.array([1], dtype=np.int64), f"{c}/axis1"),
            numpy_helper.from_array(np.array([2], dtype=np.int64), f"{c}/axis2"),
        ]
    )
    graph.input.append(helper.make_tensor_value_info(CONTEXT_INPUT, TensorProto.INT64, ["context_tokens"]))

    def step(op: str, inputs: list[str], output: str, **attrs: Any) -> onnx.NodeProto:
        return helper.make_node(op, inputs, [output], name=f"{output}/{op}", **attrs)

    graph.node.extend(
        [
            step("Gather", [f"{c}/table", CONTEXT_INPUT], f"{c}/q", axis=0),  # [ids, blocks x block bytes]
            step("Cast", [f"{c}/q"], f"{c}/qf", to=TensorProto.FLOAT),
            step("Sub", [f"{c}/qf", f"{c}/zero"], f"{c}/centred"),
            step("Reshape", [f"{c}/centred", f"{c}/blocked"], f"{c}/by_block"),
            step("Gather", [f"{c}/scales", CONTEXT_INPUT], f"{c}/s", axis=0),
            step("Unsqueeze", [f"{c}/s", f"{c}/axis2"], f"{c}/s3"),
            step("Mul", [f"{c}/by_block", f"{c}/s3"], f"{c}/scaled"),
            step("Reshape", [f"{c}/scaled", f"{c}/flat"], f"{c}/padded"),
            step("Slice", [f"{c}/padded", f"{c}/start", f"{c}/k", f"{c}/axis1"], f"{c}/rows"),  # [ids, K]
            step("Transpose", [f"{c}/rows"], f"{c}/columns", perm=[1, 0]),
            step("MatMul", [head.input[0], f"{c}/columns"], f"{c}/logits"),
            step("Concat", [f"{first}/logits", f"{c}/logits"], LOGITS, axis=-1),
        ]
    )
    graph.initializer.remove(full_blocks)
    graph.initializer.remove(full_scales)
    for out in graph.output:
        if out.name == LOGITS:
            out.type.tensor_type.shape.dim[-1].ClearField("dim_value")
            out.type.tensor_type.shape.dim[-1].dim_param = "head_tokens + context_tokens"
    props = {p.key: p.value for p in model.metadata_props}
    helper.set_model_props(model, {**props, HEAD_TOKENS_KEY: str(head_tokens)})
    return True
