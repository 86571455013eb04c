"""Attention transfer for a cut causal-LM student: the weights recorded are the model's, the KL is the KL,
a student that kept every layer matches its teacher exactly, and training on it moves the student's heads."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from typer.testing import CliRunner

from tests.tiny_models import CORPUS, build_tiny_llama, llama_bpe, tiny_llama
from tests.training.lm_cli import cache_with_cli
from training import distil_lm, lm_cache
from training.attention_transfer import (
    attention_kl,
    attention_loss,
    attention_modules,
    matched_layers,
    recorded_attention,
)
from training.cli import app


@pytest.fixture(scope="module")
def teacher():
    return tiny_llama(len(llama_bpe()), num_hidden_layers=4, std=0.1).eval()


def _ids(teacher, rows: int = 2, length: int = 12) -> torch.Tensor:
    return torch.randint(
        3, int(teacher.config.vocab_size), (rows, length), generator=torch.Generator().manual_seed(1)
    )


def _causal_softmax(scores: torch.Tensor) -> torch.Tensor:
    future = torch.ones(scores.shape[-2:], dtype=torch.bool).triu(1)
    return scores.masked_fill(future, float("-inf")).softmax(-1)


def test_attention_kl_is_each_querys_kl_averaged() -> None:
    generator = torch.Generator().manual_seed(0)
    taught = _causal_softmax(torch.randn(2, 3, 5, 5, generator=generator))
    learnt = _causal_softmax(torch.randn(2, 3, 5, 5, generator=generator))
    rows = [
        float(F.kl_div(learnt[b, h, q, : q + 1].log(), taught[b, h, q, : q + 1], reduction="sum"))
        for b in range(2)
        for h in range(3)
        for q in range(5)
    ]
    assert float(attention_kl(taught, learnt)) == pytest.approx(np.mean(rows), rel=1e-5)
    assert float(attention_kl(taught, taught)) == pytest.approx(0.0, abs=1e-7)
    underflow = learnt.clone()
    underflow[..., 0] = 0.0  # a bf16 softmax can give 0 where the teacher does not: large, not infinite
    assert torch.isfinite(attention_kl(taught, underflow))


def test_recorded_weights_are_the_eager_models_and_the_kernel_comes_back(teacher) -> None:
    ids = _ids(teacher)
    kernel = teacher.config._attn_implementation
    with recorded_attention(teacher, [1, 3]) as weights, torch.no_grad():
        teacher(input_ids=ids)
    assert sorted(weights) == [1, 3]
    assert teacher.config._attn_implementation == kernel
    teacher.set_attn_implementation("eager")
    try:
        with torch.no_grad():
            reference = teacher(input_ids=ids, output_attentions=True).attentions
    finally:
        teacher.set_attn_implementation(kernel)
    for layer in (1, 3):
        assert weights[layer].shape == (2, 4, 12, 12)  # every query head, though keys are grouped
        torch.testing.assert_close(weights[layer], reference[layer])
    with torch.no_grad():
        teacher(input_ids=_ids(teacher, length=8))  # hooks gone: another input's weights are not recorded
    assert weights[1].shape == (2, 4, 12, 12) and torch.equal(weights[1], reference[1])


def test_a_student_that_kept_every_layer_has_its_teachers_attention(teacher) -> None:
    ids = _ids(teacher)
    whole = distil_lm.student_from_teacher(
        teacher, distil_lm.DistilLMConfig(layers=4, layer_map=[0, 1, 2, 3])
    )
    logits, loss = attention_loss(whole, teacher, ids, matched_layers([0, 1, 2, 3], [1, 3]))
    assert float(loss.detach()) == pytest.approx(0.0, abs=1e-6)
    with torch.no_grad():
        torch.testing.assert_close(logits, teacher(input_ids=ids).logits)
    cut = distil_lm.student_from_teacher(teacher, distil_lm.DistilLMConfig(layers=2, layer_map=[0, 3]))
    _, loss = attention_loss(cut, teacher, ids, matched_layers([0, 3], [3]))
    assert float(loss.detach()) > 1e-3  # layer 3 now reads a residual stream without layers 1 and 2
    with pytest.raises(ValueError, match="not in the student's layer map"):
        matched_layers([0, 3], [2])
    with pytest.raises(ValueError, match=r"has layers 0\.\.3"):
        attention_loss(whole, teacher, ids, [(0, 7)])


def test_a_model_family_it_cannot_read_is_refused_before_training() -> None:
    from transformers import GPT2Config, GPT2LMHeadModel

    gpt2 = GPT2LMHeadModel(GPT2Config(vocab_size=40, n_positions=16, n_embd=16, n_layer=2, n_head=2))
    with pytest.raises(ValueError, match=r"Llama-family decoders.*GPT2LMHeadModel"):
        attention_modules(gpt2, [1])


def test_training_on_the_attention_loss_brings_the_heads_to_the_teachers(teacher, tmp_path: Path) -> None:
    text = tmp_path / "train.txt"
    text.write_text("\n".join(CORPUS[:24]) + "\n")
    lm_cache.build_cache(
        teacher, llama_bpe(), text, tmp_path / "cache", teacher_name="tiny", block_size=16, top_k=8
    )
    blocks = lm_cache.open_cache(tmp_path / "cache")
    config = distil_lm.DistilLMConfig(
        layers=2, layer_map=[0, 3], steps=20, batch_size=2, lr=3e-3, warmup_steps=1,
        alpha_kd=0.0, alpha_attention=1.0, attention_layers=[3],
    )  # fmt: skip
    torch.manual_seed(0)
    student = distil_lm.student_from_teacher(teacher, config)
    everything = blocks.batch(np.arange(len(blocks)))

    def kl() -> float:
        with torch.no_grad():
            terms = distil_lm.cached_kd_loss(student, everything, config, teacher)
        assert terms.attention is not None
        return float(terms.attention)

    before = kl()
    with pytest.raises(ValueError, match="needs the teacher"):
        distil_lm.train(student, blocks, config, tmp_path / "alone")
    assert distil_lm.train(student, blocks, config, tmp_path / "run", teacher=teacher) == 20
    assert kl() < 0.5 * before
    assert not any(p.grad is not None for p in teacher.parameters())  # the teacher only shows the way

    every_other = distil_lm.DistilLMConfig(**{**vars(config), "steps": 4, "attention_every": 2})
    matched: list[tuple[int, bool]] = []
    distil_lm.train(
        student, blocks, every_other, tmp_path / "sparse", teacher=teacher,
        log=lambda step, terms: matched.append((step, "attention" in terms)),
    )  # fmt: skip
    assert matched == [(1, True), (2, False), (3, True), (4, False)]  # the others skip the teacher


def test_cli_matches_the_named_layers_and_refuses_one_the_student_lacks(tmp_path: Path) -> None:
    teacher_dir = build_tiny_llama(tmp_path / "teacher")
    text = tmp_path / "train.txt"
    text.write_text("\n".join(CORPUS[:24]) + "\n")
    cache_with_cli(teacher_dir, text, tmp_path / "cache", 16, 8)
    common = [
        "distil-lm", "--teacher", str(teacher_dir), "--threads", "1", "--cache", str(tmp_path / "cache"),
        "--layers", "1", "--layer-map", "1", "--steps", "3", "--batch-size", "2",
        "--alpha-attention", "0.5", "--attention-every", "2",
    ]  # fmt: skip
    runner = CliRunner()
    result = runner.invoke(app, [*common, "--out", str(tmp_path / "s"), "--attention-layers", "1"])
    assert result.exit_code == 0, result.output
    assert "attention" in result.output  # logged beside the other terms (step 3 matched, as step 1)
    state = json.loads((tmp_path / "s" / "train_state.json").read_text())
    assert state["config"]["alpha_attention"] == 0.5
    assert (state["config"]["attention_layers"], state["config"]["attention_every"]) == ([1], 2)
    refused = runner.invoke(app, [*common, "--out", str(tmp_path / "r"), "--attention-layers", "0"])
    assert refused.exit_code != 0 and "not in the student's layer map" in refused.output
    unnamed = runner.invoke(app, [*common, "--out", str(tmp_path / "u")])
    assert unnamed.exit_code == 2 and "--attention-layers" in unnamed.output
