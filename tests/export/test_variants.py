"""The int8 variant: which products it quantizes, and the Gemm rewrite that lets it reach GPT-2's layers."""

from __future__ import annotations

import re
from collections import Counter
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

from export.variants import Int8Recipe, build_int8, gemms_as_matmuls
from tests.conftest import TASK_MODEL_NAMES


def run(model: onnx.ModelProto, feeds: dict[str, np.ndarray]) -> list[np.ndarray]:
    session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    return list(session.run(None, feeds))


def gemm_graph() -> onnx.ModelProto:
    """x @ w1.T + b (w1 also an output: shared), then @ w2 without a bias, then a Gemm with alpha != 1."""
    rng = np.random.default_rng(0)
    w1, b1, w2 = rng.normal(size=(16, 8)), rng.normal(size=16), rng.normal(size=(16, 4))
    inits = [
        numpy_helper.from_array(a.astype(np.float32), name)
        for a, name in ((w1, "w1"), (b1, "b1"), (w2, "w2"))
    ]
    nodes = [
        helper.make_node("Gemm", ["x", "w1", "b1"], ["h"], name="first", transB=1),
        helper.make_node("Gemm", ["h", "w2"], ["y"], name="second"),
        helper.make_node("Gemm", ["h", "w2"], ["z"], name="scaled", alpha=0.5),
        helper.make_node("Identity", ["w1"], ["w1_out"], name="keep"),
    ]
    graph = helper.make_graph(
        nodes,
        "gemms",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [3, 8])],
        [
            helper.make_tensor_value_info(name, TensorProto.FLOAT, shape)
            for name, shape in (("y", [3, 4]), ("z", [3, 4]), ("w1_out", [16, 8]))
        ],
        inits,
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)], ir_version=9)


def test_gemms_become_matmul_and_add_with_the_same_outputs() -> None:
    model = gemm_graph()
    feeds = {"x": np.random.default_rng(1).normal(size=(3, 8)).astype(np.float32)}
    before = run(model, feeds)
    gemms_as_matmuls(model.graph)
    onnx.checker.check_model(model)
    ops = Counter(n.op_type for n in model.graph.node)
    assert ops == {"MatMul": 2, "Add": 1, "Gemm": 1, "Identity": 1}  # alpha != 1 is left a Gemm
    for got, want in zip(run(model, feeds), before, strict=True):
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)  # the shared w1 is still output as it was


@pytest.mark.parametrize("repository", ["tiny_repository", "optimum_lm_repository"])
def test_int8_quantizes_gpt2_layers_but_not_attention_or_the_tied_head(
    repository: str, request: pytest.FixtureRequest, tmp_path: Path
) -> None:
    """On both decoder graphs (distilserve's appending one and optimum's)."""
    fp32 = request.getfixturevalue(repository) / TASK_MODEL_NAMES["text-generation"] / "1" / "model.onnx"
    layers = sum(n.op_type == "Gemm" for n in onnx.load(str(fp32)).graph.node)
    assert layers > 0  # GPT-2's Conv1D layers export as Gemm: ORT's dynamic quantization has no integer Gemm
    build_int8(fp32, tmp_path / "int8.onnx")
    graph = onnx.load(str(tmp_path / "int8.onnx")).graph
    ops = Counter(n.op_type for n in graph.node)
    assert ops["MatMulInteger"] == layers and ops["Gemm"] == 0
    weights = {init.name for init in graph.initializer}
    float_products = [n for n in graph.node if n.op_type == "MatMul"]
    # What stays float multiplies activations only: attention's products and the head (a transposed table).
    assert float_products and not any(set(n.input) & weights for n in float_products)
    assert any("lm_head" in n.name for n in float_products)
    tables = [n.input[0] for n in graph.node if n.op_type == "Gather" and n.input[0] in weights]
    uses = Counter(name for n in graph.node for name in n.input)
    kept = [t for t in tables if not t.endswith("_quantized")]
    assert len(kept) == 1 and uses[kept[0]] > 1  # the token table, tied to the output head: stays fp32
    assert sum(t.endswith("_quantized") for t in tables) == 1  # the position table, read by its lookup alone


def test_an_int8_recipe_leaves_the_nodes_it_names_and_the_tables_in_fp32(
    tiny_repository: Path, tmp_path: Path
) -> None:
    fp32 = tiny_repository / TASK_MODEL_NAMES["text-classification"] / "1" / "model.onnx"
    ffn_down = r"layer\.\d+/output/dense/"  # BERT's feed-forward down projection, not attention's output
    recipe = Int8Recipe("test", keep_fp32=(ffn_down,), embeddings=False, per_channel=False)
    build_int8(fp32, tmp_path / "int8.onnx", recipe)
    graph = onnx.load(str(tmp_path / "int8.onnx")).graph
    weights = {init.name for init in graph.initializer}
    weighted = [n for n in graph.node if n.op_type == "MatMul" and set(n.input) & weights]
    assert {re.sub(r"\d+", "N", n.name) for n in weighted} == {"/bert/encoder/layer.N/output/dense/MatMul"}
    named = sum(
        n.op_type == "MatMul" and bool(re.search(ffn_down, n.name)) for n in onnx.load(str(fp32)).graph.node
    )
    assert len(weighted) == named > 0  # every one the pattern names, in every layer
    assert not any(n.op_type == "Gather" and n.input[0].endswith("_quantized") for n in graph.node)
    scales = [i for i in graph.initializer if i.name.endswith("_scale") and "MatMul" in i.name]
    assert scales and all(len(s.dims) == 0 for s in scales)  # per tensor: one scale a weight
    attention_out = [n for n in graph.node if n.op_type == "MatMulInteger" and "attention/output" in n.name]
    assert attention_out  # the pattern did not catch attention's output projection


def test_the_weight_only_recipe_blocks_every_weighted_matmul_and_keeps_the_answers(
    tiny_repository: Path, tmp_path: Path
) -> None:
    fp32 = tiny_repository / TASK_MODEL_NAMES["text-classification"] / "1" / "model.onnx"
    build_int8(fp32, tmp_path / "int8.onnx", Int8Recipe("weight-only", method="weight-only", block_size=32))
    before, after = onnx.load(str(fp32)).graph, onnx.load(str(tmp_path / "int8.onnx")).graph
    weights = {init.name for init in before.initializer}
    weighted = sum(n.op_type in ("MatMul", "Gemm") and bool(set(n.input[1:2]) & weights) for n in before.node)
    ops = Counter(n.op_type for n in after.node)
    assert ops["MatMulNBits"] == weighted > 0 and ops["MatMulInteger"] == 0
    rng = np.random.default_rng(0)
    feeds = {
        "input_ids": rng.integers(5, 50, size=(4, 12)),
        "attention_mask": np.ones((4, 12), dtype=np.int64),
        "token_type_ids": np.zeros((4, 12), dtype=np.int64),
    }
    [want] = run(onnx.load(str(fp32)), feeds)
    [got] = run(onnx.load(str(tmp_path / "int8.onnx")), feeds)
    np.testing.assert_allclose(got, want, atol=0.05 * float(np.abs(want).max()) + 1e-3)
