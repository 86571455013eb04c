"""The int4 variant: a model whose weights were 4-bit at their source (GGUF's Q4_1, as `training import`
dequantizes it) gets them back as the 4-bit blocks they were, and the graph then computes what the fp32 one
does: the same logits to float rounding, PyTorch's greedy text with the KV cache, served too. A model that
was never 4-bit has no int4 variant, and the export says why."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort

from export.greedy import greedy_onnx
from export.pipeline import export_model
from export.source_blocks import BLOCK, on_grid
from service.engine import OrtEngine
from service.generation.sampling import SamplingParams
from service.repository import read_version
from service.runtime import choose_variant
from tests.service.generation.helpers import pytorch_greedy, together
from tests.tiny_models import CORPUS, q4_1

PROMPTS = ["I loved this", "Acme was founded by John Smith in 1950", "Who"]


def q4_0(weight: np.ndarray) -> np.ndarray:
    """`weight` through GGUF's Q4_0 and back: `d * (q - 8)`, d the block's signed extreme / -8 in fp16."""
    out, inputs = weight.shape
    blocks = weight.reshape(out, inputs // BLOCK, BLOCK).astype(np.float32)
    extreme = np.take_along_axis(blocks, np.abs(blocks).argmax(-1)[..., None], -1)[..., 0]
    d = (extreme / -8).astype(np.float16).astype(np.float32)
    q = np.clip(np.trunc(blocks / np.where(d != 0, d, 1)[..., None] + 8.5), 0, 15)
    return (d[..., None] * (q - 8).astype(np.float32)).reshape(out, inputs)


def q4_k(weight: np.ndarray, seed: int = 0) -> np.ndarray:
    """`weight` through the shape of GGUF's Q4_K and back: super-blocks of 256 with fp16 `d` and `dmin`, each
    sub-block of 32 `d * sc * q - dmin * m` with 6-bit `sc` and `m` (chosen here, not fitted as llama.cpp
    fits them: a sub-block's codes then need not reach 0 or 15)."""
    out, inputs = weight.shape
    rng = np.random.default_rng(seed)
    blocks = weight.reshape(out, inputs // 256, 8, BLOCK).astype(np.float32)
    d = (np.abs(blocks).max(axis=(-2, -1)) / 15 / 40).astype(np.float16).astype(np.float32)[..., None]
    sc = rng.integers(40, 64, blocks.shape[:-1]).astype(np.float32)
    m = rng.integers(0, 63, blocks.shape[:-1]).astype(np.float32)
    dmin = d / 8
    q = np.clip(np.rint((blocks + (dmin * m)[..., None]) / (d * sc)[..., None]), 0, 15)
    return ((d * sc)[..., None] * q - (dmin * m)[..., None]).astype(np.float32).reshape(out, inputs)


def rebuilt(weight: np.ndarray) -> np.ndarray:
    grid = on_grid(weight)
    assert grid is not None and grid.codes.max() <= 15
    n, blocks, _ = grid.codes.shape
    return (grid.codes * grid.scales[..., None] + grid.minimums[..., None]).reshape(n, blocks * BLOCK).T


def test_a_q4_1_weight_is_recovered_exactly_and_others_are_not_taken_for_one() -> None:
    rng = np.random.default_rng(0)
    source = rng.standard_normal((96, 64)).astype(np.float32) * 0.05  # [out, in]
    source[3, :32] = 0.25  # a block of one value: its range is 0
    weight = q4_1(source).T  # [K, N], as the graph's MatMul reads it
    grid = on_grid(weight)
    assert grid is not None and grid.codes.shape == (96, 2, BLOCK) and grid.codes.max() == 15
    np.testing.assert_allclose(rebuilt(weight), weight, rtol=0, atol=1e-7)
    q4_0_weight = q4_0(source).T  # its +7 end often unused: the grid's step is then its smallest gap
    np.testing.assert_allclose(rebuilt(q4_0_weight), q4_0_weight, rtol=0, atol=1e-7)
    k_quant = q4_k(rng.standard_normal((16, 512)).astype(np.float32) * 0.05).T
    np.testing.assert_allclose(rebuilt(k_quant), k_quant, rtol=0, atol=1e-7)
    assert on_grid(source.T) is None  # float weights are not on a 16-step grid
    assert on_grid(q4_1(source)[:, :48].T) is None  # K not whole blocks
    eight_bit = np.round(source / np.abs(source).max() * 127) / 127  # 255 levels: not 16 a block
    assert on_grid(eight_bit.T.astype(np.float32)) is None


def test_the_int4_graph_holds_every_layer_in_4_bits_and_computes_what_fp32_does(
    q4_llama: tuple[Path, Path],
) -> None:
    exported = q4_llama[1]
    manifest = read_version(exported).manifest
    int4 = manifest.variants["int4"]
    assert int4.precision == "int4" and int4.device == "cpu"
    assert choose_variant(manifest, "auto", on_gpu=False) == "int4"  # no int8 here: a CPU serves int4
    assert choose_variant(manifest, "auto", on_gpu=True) == "fp32"
    assert int4.parity["top1_agreement"] == 1.0 and int4.parity["eval_rows"] > 0
    assert int4.parity["greedy_match"] == 1.0  # the gate holds it to fp32's greedy text
    assert int4.size_bytes < 0.7 * manifest.variants["fp32"].size_bytes  # the tied table stays fp32
    graph = onnx.load(str(exported / "model.int4.onnx")).graph
    assert sum(n.op_type == "MatMulNBits" for n in graph.node) == 2 * 4  # qkv, o, gate + up, down a layer
    assert int4.recipe == "source 4-bit blocks: 8 of 8 weighted MatMuls"  # the tied head is no weight here
    sessions = [
        ort.InferenceSession(str(exported / name), providers=["CPUExecutionProvider"])
        for name in ("model.onnx", "model.int4.onnx")
    ]
    layout = manifest.generation
    assert layout is not None
    rng = np.random.default_rng(1)
    ids = rng.integers(3, 200, (2, 9))
    feeds = {
        "input_ids": ids,
        "attention_mask": np.ones_like(ids),
        "position_ids": np.tile(np.arange(9), (2, 1)),
        "logit_positions": np.tile(np.arange(9), (2, 1)),
    } | {
        f"past_key_values.{i}.{kind}": np.zeros(
            (2, layout.num_key_value_heads, 0, layout.head_dim), np.float32
        )
        for i in range(layout.num_layers)
        for kind in ("key", "value")
    }
    fp32, int4_logits = (s.run(["logits"], feeds)[0] for s in sessions)
    np.testing.assert_allclose(int4_logits, fp32, rtol=0, atol=1e-4 * max(1.0, float(np.abs(fp32).max())))


def test_int4_greedy_equals_pytorch_with_the_cache_and_served(q4_llama: tuple[Path, Path]) -> None:
    from service.tokenization import TextEncoder

    hf, exported = q4_llama
    version = read_version(exported)
    layout = version.manifest.generation
    assert layout is not None
    session = ort.InferenceSession(str(exported / "model.int4.onnx"), providers=["CPUExecutionProvider"])
    prompts, expected = pytorch_greedy(hf, PROMPTS, 16, layout.eos_token_id)
    assert [greedy_onnx(session, layout, p, 16) for p in prompts] == expected
    encoder = TextEncoder(version.file(version.manifest.tokenizer.file), version.manifest.tokenizer)
    with ThreadPoolExecutor(max_workers=1) as executor:
        served = (OrtEngine(version.file("model.int4.onnx"), device="cpu"), layout, encoder, executor)
        assert together(served, prompts, SamplingParams(max_new_tokens=16)) == expected


def test_a_model_that_was_never_4_bit_has_no_int4_variant(tiny_llama_dir: Path, tmp_path: Path) -> None:
    eval_text = tmp_path / "eval.txt"
    eval_text.write_text("\n".join(dict.fromkeys(CORPUS)) + "\n", encoding="utf-8")
    result = export_model(
        tiny_llama_dir, "text-generation", "llama", tmp_path, ("fp32", "int4"), eval_data=eval_text
    )
    problems = {r.variant: r.problems for r in result.variants}
    assert problems["fp32"] == [] and result.version_dir is not None
    assert any("no weight lies on a 4-bit block grid" in p for p in problems["int4"]), problems
    assert "int4" not in read_version(result.version_dir).manifest.variants
