"""The appending decoder graphs (GPT-2, and Llama with grouped-query attention) compute PyTorch's logits
with a cache the caller keeps."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import onnxruntime as ort
import pytest

from common.logit_positions import LOGIT_POSITIONS, ending_positions, every_position
from export.appending_decoder import export_appending_decoder
from export.tasks import decoder_shape


@pytest.fixture(scope="module", params=["gpt2", "llama", "llama-untied-mha", "llama-traced", "llama-biased"])
def decoder(
    request: pytest.FixtureRequest, tiny_models: dict[str, Path], tmp_path_factory: pytest.TempPathFactory
) -> tuple[Any, ort.InferenceSession]:
    from transformers import AutoModelForCausalLM

    from tests.tiny_models import tiny_llama

    if request.param == "gpt2":
        model = AutoModelForCausalLM.from_pretrained(tiny_models["text-generation"]).eval()
    elif request.param == "llama":  # weights wider than the init: logits far apart, a harder test
        model = tiny_llama(vocab_size=300, std=0.2)
    elif request.param == "llama-untied-mha":  # as many key/value heads as heads, an output head of its own
        model = tiny_llama(vocab_size=300, std=0.2, num_key_value_heads=4, tie_word_embeddings=False)
    elif request.param == "llama-traced":  # the torch.onnx trace, for Llamas the fused graph does not cover
        model = tiny_llama(vocab_size=300, std=0.2)
    else:  # biases on the attention's projections (Qwen2-style Llamas), and a scaled rope
        rope = {"rope_type": "linear", "factor": 2.0}
        model = tiny_llama(vocab_size=300, std=0.2, attention_bias=True, rope_scaling=rope)
    path = tmp_path_factory.mktemp(f"appending-{request.param}") / "model.onnx"
    export_appending_decoder(model, path, opset=17, traced=request.param == "llama-traced")
    return model, ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])


def _feeds(
    ids: np.ndarray,
    mask: np.ndarray,
    positions: np.ndarray,
    past: list[np.ndarray],
    logit_positions: np.ndarray | None = None,
) -> dict:
    feeds = {"input_ids": ids, "attention_mask": mask, "position_ids": positions}
    feeds[LOGIT_POSITIONS] = every_position(*ids.shape) if logit_positions is None else logit_positions
    for layer in range(len(past) // 2):
        feeds[f"past_key_values.{layer}.key"] = past[2 * layer]
        feeds[f"past_key_values.{layer}.value"] = past[2 * layer + 1]
    return feeds


def _reference(model: object, tokens: list[int]) -> np.ndarray:
    import torch

    with torch.no_grad():
        return model(input_ids=torch.tensor([tokens])).logits[0].numpy()  # type: ignore[operator]


def test_padded_prefill_then_decode_into_a_roomy_cache_equals_pytorch(
    decoder: tuple[Any, ort.InferenceSession],
) -> None:
    """Right-padded prompts of different lengths, then steps whose past is a preallocated cache with
    unused (masked, zero) columns and gaps, as the runner keeps it: every real row's logits equal
    PyTorch run on that sequence alone, and `present` is only the new position (for Llama, with as many
    heads as the key/value heads, fewer than the attention's)."""
    model, session = decoder
    config = model.config
    layers, _, heads, head_dim = decoder_shape(config)
    rng = np.random.default_rng(0)
    lengths = [7, 2, 5]
    rows, width = len(lengths), max(lengths)
    ids = np.zeros((rows, width), dtype=np.int64)
    mask = np.zeros((rows, width), dtype=np.int64)
    for row, n in enumerate(lengths):
        ids[row, :n], mask[row, :n] = rng.integers(5, config.vocab_size, n), 1
    positions = np.clip(np.cumsum(mask, axis=1) - 1, 0, None)
    empty = [np.zeros((rows, heads, 0, head_dim), dtype=np.float32)] * (2 * layers)
    logits, *presents = session.run(None, _feeds(ids, mask, positions, empty))
    tokens = [ids[row, :n].tolist() for row, n in enumerate(lengths)]
    for row, n in enumerate(lengths):
        np.testing.assert_allclose(logits[row, :n], _reference(model, tokens[row]), atol=1e-4)
    assert all(p.shape == (rows, heads, width, head_dim) for p in presents)

    capacity = width + 6  # room the runner keeps after the used columns
    cache = [np.zeros((rows, heads, capacity, head_dim), dtype=np.float32) for _ in presents]
    for tensor, present in zip(cache, presents, strict=True):
        tensor[:, :, :width] = present
    cache_mask = np.zeros((rows, capacity), dtype=np.int64)
    cache_mask[:, :width] = mask
    used = width
    last = [int(logits[row, n - 1].argmax()) for row, n in enumerate(lengths)]
    for _ in range(4):
        for row in range(rows):
            tokens[row].append(last[row])
        step_mask = np.concatenate([cache_mask, np.ones((rows, 1), dtype=np.int64)], axis=1)
        step_positions = np.array([[len(t) - 1] for t in tokens], dtype=np.int64)
        logits, *presents = session.run(
            None, _feeds(np.array(last)[:, None], step_mask, step_positions, cache)
        )
        assert all(p.shape == (rows, heads, 1, head_dim) for p in presents)
        for row in range(rows):
            np.testing.assert_allclose(logits[row, 0], _reference(model, tokens[row])[-1], atol=1e-4)
        for tensor, present in zip(cache, presents, strict=True):
            tensor[:, :, used] = present[:, :, 0]
        cache_mask[:, used] = 1
        used += 1
        last = [int(logits[row, 0].argmax()) for row in range(rows)]


def test_a_llama_is_written_with_fused_operators_and_its_fp16_follows_pytorch(tmp_path: Path) -> None:
    """The export writes a Llama node by node (export/llama_graph.py): onnx's checker accepts it, ONNX
    Runtime's fused operators stand where the traced graph had dozens of shape nodes a layer, and its fp16
    variant (the GPU's) still computes PyTorch's logits within fp16's precision."""
    import onnx

    from export.variants import build_fp16
    from tests.tiny_models import tiny_llama

    model = tiny_llama(vocab_size=300)
    fp32, fp16 = tmp_path / "model.onnx", tmp_path / "model.fp16.onnx"
    export_appending_decoder(model, fp32, opset=17)
    onnx.checker.check_model(str(fp32), full_check=True)
    ops = [node.op_type for node in onnx.load(str(fp32)).graph.node]
    layers = model.config.num_hidden_layers
    assert ops.count("RotaryEmbedding") == 2 * layers
    assert ops.count("MatMul") == 6 * layers + 1  # qkv, o, gate + up, down, the probabilities twice; head
    assert (
        len(ops) < 40 * layers + 25
    )  # ~35 a layer, ~20 once a call; the traced graph: ~90 a layer after ONNX Runtime's own fusions
    build_fp16(fp32, fp16)
    session = ort.InferenceSession(str(fp16), providers=["CPUExecutionProvider"])
    tokens = [5, 17, 42, 7, 99]
    _, _, kv_heads, head_dim = decoder_shape(model.config)
    empty = [np.zeros((1, kv_heads, 0, head_dim), dtype=np.float32)] * (2 * layers)
    ids = np.array([tokens], dtype=np.int64)
    logits = session.run(None, _feeds(ids, np.ones_like(ids), np.arange(len(tokens))[None], empty))[0]
    reference = _reference(model, tokens)
    np.testing.assert_allclose(logits[0], reference, atol=2e-2 * np.abs(reference).max())
    assert (logits[0].argmax(-1) == reference.argmax(-1)).all()


def test_a_llama_the_fused_graph_does_not_cover_is_traced_and_still_equals_pytorch(tmp_path: Path) -> None:
    """A rope whose angles depend on the sequence's length (dynamic NTK scaling) cannot be a fixed cos/sin
    table: such a Llama goes the traced way, and its logits are still PyTorch's."""
    import onnx

    from export.llama_graph import fuses
    from tests.tiny_models import tiny_llama

    model = tiny_llama(vocab_size=300, rope_scaling={"rope_type": "dynamic", "factor": 2.0})
    assert not fuses(model.config) and fuses(tiny_llama(vocab_size=300).config)
    path = tmp_path / "model.onnx"
    export_appending_decoder(model, path, opset=17)
    assert "RotaryEmbedding" not in {node.op_type for node in onnx.load(str(path)).graph.node}
    session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    tokens = [5, 17, 42, 7]
    layers, _, kv_heads, head_dim = decoder_shape(model.config)
    empty = [np.zeros((1, kv_heads, 0, head_dim), dtype=np.float32)] * (2 * layers)
    ids = np.array([tokens], dtype=np.int64)
    logits = session.run(None, _feeds(ids, np.ones_like(ids), np.arange(len(tokens))[None], empty))[0]
    np.testing.assert_allclose(logits[0], _reference(model, tokens), atol=1e-4)


def test_logits_come_out_at_the_positions_asked_for_each_row(
    decoder: tuple[Any, ort.InferenceSession],
) -> None:
    """`logit_positions` [rows, n] picks each row's positions to score (common/logit_positions.py): the
    logits are the whole call's at those positions, the cache the same; a prefill asks for each prompt's
    last position alone."""
    model, session = decoder
    layers, _, heads, head_dim = decoder_shape(model.config)
    rng = np.random.default_rng(1)
    lengths = np.array([7, 2, 5])
    rows, width = len(lengths), int(lengths.max())
    mask = (np.arange(width)[None] < lengths[:, None]).astype(np.int64)
    ids = rng.integers(5, model.config.vocab_size, (rows, width)) * mask
    positions = np.clip(np.cumsum(mask, axis=1) - 1, 0, None)
    empty = [np.zeros((rows, heads, 0, head_dim), dtype=np.float32)] * (2 * layers)
    every, *presents = session.run(None, _feeds(ids, mask, positions, empty))
    picked = np.array([[6, 0], [1, 1], [2, 4]])
    some, *same_presents = session.run(None, _feeds(ids, mask, positions, empty, picked))
    assert some.shape == (rows, 2, every.shape[2])
    np.testing.assert_allclose(some, np.take_along_axis(every, picked[..., None], axis=1), atol=1e-5)
    for got, want in zip(same_presents, presents, strict=True):
        np.testing.assert_array_equal(got, want)
    ending = ending_positions(lengths, 0, width)
    ends = session.run(["logits"], _feeds(ids, mask, positions, empty, ending))[0]
    np.testing.assert_allclose(ends[:, 0], every[np.arange(rows), lengths - 1], atol=1e-5)
