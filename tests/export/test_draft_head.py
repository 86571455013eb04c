"""A draft's head cut to the first ids plus the contexts' (export/draft_head.py): the same numbers as the
uncut 8-bit head in every column it scores, and heads it cannot cut refused with a reason. (The export of
a cut draft, its manifest and gate: tests/export/test_llama_export.py.)"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest

from common.draft_head import CONTEXT_INPUT, HEAD_TOKENS_KEY, DraftHead
from common.logit_positions import LOGIT_POSITIONS, every_position
from export.draft_head import restrict_head
from export.onnx_export import export_onnx
from export.variants import build_draft


@pytest.fixture(scope="module")
def fp32(tiny_llama_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    return export_onnx(tiny_llama_dir, "text-generation", tmp_path_factory.mktemp("llama-onnx"))


@pytest.fixture(scope="module")
def vocabulary(tiny_llama_dir: Path) -> int:
    return int(json.loads((tiny_llama_dir / "config.json").read_text())["vocab_size"])


def run(path: Path, ids: np.ndarray, context: np.ndarray | None = None) -> np.ndarray:
    session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    feeds: dict[str, np.ndarray] = {
        "input_ids": ids,
        "attention_mask": np.ones_like(ids),
        "position_ids": np.tile(np.arange(ids.shape[1]), (len(ids), 1)),
        LOGIT_POSITIONS: every_position(*ids.shape),
    }
    for i in session.get_inputs():
        if i.name.startswith("past_key_values"):
            feeds[i.name] = np.zeros((len(ids), int(i.shape[1]), 0, int(i.shape[3])), dtype=np.float32)
    if context is not None:
        feeds[CONTEXT_INPUT] = context
    logits: np.ndarray = session.run(["logits"], feeds)[0]
    return logits


def test_the_cut_head_scores_its_columns_as_the_uncut_one_does(
    fp32: Path, vocabulary: int, tmp_path: Path
) -> None:
    uncut, cut = tmp_path / "uncut.onnx", tmp_path / "cut.onnx"
    tokens = vocabulary // 4
    assert build_draft(fp32, uncut, head_tokens=None) is None
    assert build_draft(fp32, cut, head_tokens=tokens) == tokens
    meta = ort.InferenceSession(str(cut), providers=["CPUExecutionProvider"]).get_modelmeta()
    assert meta.custom_metadata_map[HEAD_TOKENS_KEY] == str(tokens)
    head = DraftHead(tokens, vocabulary)
    ids = np.random.default_rng(0).integers(3, vocabulary, size=(2, 9))
    reference = run(uncut, ids)
    scale = float(np.abs(reference).max())
    first = run(cut, ids, np.zeros(0, dtype=np.int64))  # no context: the first ids only, the same kernel
    assert first.shape[-1] == tokens
    np.testing.assert_allclose(first, reference[..., :tokens], atol=1e-5 * scale)
    context = np.array([vocabulary - 1, tokens + 3, tokens])
    picked = run(cut, ids, context)  # the context's columns: its rows dequantized, multiplied in fp32
    assert np.abs(picked - reference[..., head.columns(context)]).max() <= 0.05 * scale
    whole = run(cut, ids, head.every_token())  # what the gate compares: every token in id order
    assert whole.shape == reference.shape
    assert (whole.argmax(-1) == reference.argmax(-1)).mean() >= 0.99


def test_a_vocabulary_within_the_cut_keeps_its_whole_head(
    fp32: Path, vocabulary: int, tmp_path: Path
) -> None:
    for tokens in (vocabulary, 0):
        out = tmp_path / f"draft-{tokens}.onnx"
        assert build_draft(fp32, out, head_tokens=tokens) is None
        names = [i.name for i in onnx.load(str(out)).graph.input]
        assert CONTEXT_INPUT not in names


def test_a_head_it_cannot_read_is_refused_with_a_reason(fp32: Path) -> None:
    model = onnx.load(str(fp32))  # fp32: the logits come from a plain MatMul, not 8-bit blocks
    with pytest.raises(ValueError, match="MatMulNBits"):
        restrict_head(model, 8)
