"""The int4 variant: weights that were 4-bit at their source written back as the 4-bit blocks they were.

A model imported from a GGUF file in Q4_1 (SmolLM2-135M-Instruct here) holds, once dequantized to float32,
weights that lie exactly on a grid: in each block of 32 along the input, `w = d * q + m` with `q` in 0..15,
the block's smallest weight at `q = 0` and its largest at `q = 15` (that is how Q4_1 picks `d` and `m`;
Q4_0's blocks and the k-quants' 4-bit sub-blocks are such grids too, their ends not always used).
Recovering `q`, `d` and `m` loses nothing, so a graph that computes with them computes what the source model
computes, where requantizing its float weights to 8 bits moves them off the grid and changed SmolLM2's next
token at 2 % of positions (docs/benchmarks.md). Each such MatMul becomes ONNX Runtime's MatMulNBits (4-bit
codes and scales `d`, zero point 0, float32 compute) plus the blocks' minimums as a small correction:
`x @ W = MatMulNBits(x) + (x @ S) @ M`, with `S` summing each block of the input and `M` the `m`s (float
zero points would hold `m` directly, but send MatMulNBits down its unpacked path: 14x slower at one row). A
weight that is not on such a grid stays float32; where none is, there is no int4 variant to build.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np

BLOCK = 32  # GGUF's block of the legacy and k-quant formats alike
# A recovered weight must equal the float weight to within this share of the block's range: float32
# rounding in the dequantization, nothing more (a weight off the grid misses by up to half a step, 1/30).
GRID_TOLERANCE = 1e-5


@dataclass(frozen=True)
class Grid:
    """A weight `[K, N]` as 4-bit blocks along K: codes `[N, K / 32, 32]`; scales, minimums `[N, K / 32]`."""

    codes: np.ndarray
    scales: np.ndarray
    minimums: np.ndarray


def _codes(blocks: np.ndarray, low: np.ndarray, scales: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Each block's codes on the grid `low + scale * q`, and how far the rebuilt block misses the weights
    (a share of the block's size; a code outside 0..15 misses by construction)."""
    step = np.where(scales > 0, scales, 1.0)[..., None]
    exact = np.rint((blocks - low[..., None]) / step)
    codes = np.clip(exact, 0, 15)
    rebuilt = codes * scales[..., None].astype(np.float64) + low.astype(np.float32)[..., None]
    size = np.maximum(blocks.max(axis=-1) - low, np.abs(low))[..., None] + 1e-30
    miss = (np.abs(rebuilt - blocks) / size).max(axis=-1) + (exact != codes).any(axis=-1)
    return codes.astype(np.uint8), miss


def on_grid(weight: np.ndarray) -> Grid | None:
    """The weight's 4-bit blocks, where every block lies on a grid of at most 16 steps from its minimum;
    None where any does not (or K is not whole blocks). The step is the block's range / 15 where its ends
    are codes 0 and 15 (Q4_1 always), else its smallest gap between two weights (Q4_0's `d * (q - 8)`
    and the k-quants' sub-blocks, whose ends need not be used)."""
    k, n = weight.shape
    if k % BLOCK:
        return None
    blocks = weight.T.reshape(n, k // BLOCK, BLOCK).astype(np.float64)
    low, high = blocks.min(axis=-1), blocks.max(axis=-1)
    ranged = ((high - low) / 15).astype(np.float32)
    codes, miss = _codes(blocks, low, ranged)
    if (miss > GRID_TOLERANCE).any():
        gaps = np.diff(np.sort(blocks, axis=-1), axis=-1)
        gaps[gaps <= GRID_TOLERANCE * (high - low)[..., None]] = np.inf  # equal weights
        smallest = gaps.min(axis=-1)
        gapped = np.where(np.isfinite(smallest), smallest, 0.0).astype(np.float32)
        other, other_miss = _codes(blocks, low, gapped)
        use = miss > GRID_TOLERANCE
        codes[use], miss[use], ranged[use] = other[use], other_miss[use], gapped[use]
        if (miss > GRID_TOLERANCE).any():
            return None
    return Grid(codes, ranged, low.astype(np.float32))


def _nibbles(codes: np.ndarray) -> np.ndarray:
    """MatMulNBits' layout: two codes a byte, the first in the low half."""
    return (codes[..., 0::2] | (codes[..., 1::2] << 4)).astype(np.uint8)


def build_int4(fp32: Path, out: Path) -> str:
    """The int4 graph of `fp32`: every MatMul whose weight is on a 4-bit grid rewritten (see the module);
    returns how many were, of how many with a weight. ValueError where none is (never 4-bit)."""
    import onnx
    from onnx import helper, numpy_helper

    from export.onnx_files import save
    from export.variants import fold_weight_transposes, gemms_as_matmuls

    model = onnx.load(str(fp32))
    graph = model.graph
    gemms_as_matmuls(graph)
    fold_weight_transposes(graph)
    weights = {init.name: init for init in graph.initializer}
    readers: dict[str, int] = {}
    for node in graph.node:
        for name in node.input:
            readers[name] = readers.get(name, 0) + 1
    nodes, sums, rewritten, weighted = [], {}, 0, 0
    for node in graph.node:
        source = node.input[1] if node.op_type == "MatMul" and len(node.input) == 2 else None
        init = weights.get(source) if source is not None and readers.get(source) == 1 else None
        array = numpy_helper.to_array(init) if init is not None and len(init.dims) == 2 else None
        weighted += array is not None
        grid = on_grid(array) if array is not None and array.dtype == np.float32 else None
        if grid is None:
            nodes.append(node)
            continue
        k, n = array.shape  # type: ignore[union-attr]
        base = f"{source}/int4"
        if k not in sums:
            summing = np.zeros((k, k // BLOCK), np.float32)
            summing[np.arange(k), np.arange(k) // BLOCK] = 1.0
            sums[k] = f"block_sums_{k}"
            graph.initializer.append(numpy_helper.from_array(summing, sums[k]))
        zero = np.zeros(n * ((k // BLOCK + 1) // 2), np.uint8)
        graph.initializer.extend(
            [
                numpy_helper.from_array(_nibbles(grid.codes), f"{base}/codes"),
                numpy_helper.from_array(grid.scales.reshape(-1), f"{base}/scales"),
                numpy_helper.from_array(zero, f"{base}/zero_points"),
                numpy_helper.from_array(np.ascontiguousarray(grid.minimums.T), f"{base}/minimums"),
            ]
        )
        graph.initializer.remove(init)
        x, y = node.input[0], node.output[0]
        nodes += [
            helper.make_node(
                "MatMulNBits",
                [x, f"{base}/codes", f"{base}/scales", f"{base}/zero_points"],
                [f"{y}/int4"],
                name=f"{node.name}/int4",
                domain="com.microsoft",
                K=k,
                N=n,
                bits=4,
                block_size=BLOCK,
                accuracy_level=1,  # float32 compute: int8 activations would lose what the grid keeps
            ),
            helper.make_node("MatMul", [x, sums[k]], [f"{y}/block_sums"], name=f"{node.name}/block_sums"),
            helper.make_node(
                "MatMul",
                [f"{y}/block_sums", f"{base}/minimums"],
                [f"{y}/minimums"],
                name=f"{node.name}/minimums",
            ),
            helper.make_node("Add", [f"{y}/int4", f"{y}/minimums"], [y], name=f"{node.name}/int4_add"),
        ]
        rewritten += 1
    if not rewritten:
        raise ValueError("no weight lies on a 4-bit block grid: the model was not 4-bit at its source")
    graph.ClearField("node")
    graph.node.extend(nodes)
    if not any(o.domain == "com.microsoft" for o in model.opset_import):
        model.opset_import.append(helper.make_opsetid("com.microsoft", 1))
    save(model, out)
    return f"source 4-bit blocks: {rewritten} of {weighted} weighted MatMuls"
