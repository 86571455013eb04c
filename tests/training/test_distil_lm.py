"""LM distillation from a cache of teacher top-k logits: the cache, the student cut, the loss, resume."""

from __future__ import annotations

import itertools
import json
import math
from dataclasses import asdict
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from transformers import AutoModelForCausalLM
from typer.testing import CliRunner

from export.manifest import distillation_record
from tests.tiny_models import CORPUS, build_tiny_llama, llama_bpe, tiny_llama
from tests.training.lm_cli import cache_with_cli
from training import distil_lm, lm_cache
from training.cli import app
from training.losses import distillation_loss, top_k_distillation_loss

BLOCK, K = 16, 8


@pytest.fixture(scope="module")
def tokenizer():
    return llama_bpe()


@pytest.fixture(scope="module")
def text(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("text") / "train.txt"
    path.write_text("\n".join(CORPUS[:24]) + "\n")
    return path


@pytest.fixture(scope="module")
def teacher(tokenizer):
    return tiny_llama(len(tokenizer), num_hidden_layers=4, std=0.1)


def _cache(teacher, tokenizer, text: Path, out: Path, **kwargs: Any) -> int:
    return lm_cache.build_cache(
        teacher, tokenizer, text, out, teacher_name="tiny", block_size=BLOCK, top_k=K, batch_size=2, **kwargs
    )


def test_cache_holds_the_teachers_top_k(teacher, tokenizer, text: Path, tmp_path: Path) -> None:
    done = _cache(teacher, tokenizer, text, tmp_path / "cache")
    blocks = lm_cache.open_cache(tmp_path / "cache")
    assert done == len(blocks) == blocks.meta.num_blocks >= 4
    batch = blocks.batch(np.arange(len(blocks)))
    with torch.no_grad():
        values, indices = teacher(input_ids=batch["input_ids"]).logits.topk(K, dim=-1)
        probabilities = teacher(input_ids=batch["input_ids"]).logits.softmax(dim=-1)
    assert torch.equal(batch["indices"], indices)
    torch.testing.assert_close(batch["values"], values.half().float())
    assert batch["input_ids"].shape == (len(blocks), BLOCK)
    torch.testing.assert_close(batch["mass"], probabilities.gather(-1, indices).sum(-1))
    # a smaller k reads the first (largest) ones, and the probability they alone hold
    smaller = blocks.batch(np.arange(2), top_k=3)
    assert torch.equal(smaller["indices"], batch["indices"][:2, :, :3])
    torch.testing.assert_close(
        smaller["mass"], probabilities[:2].gather(-1, indices[:2, :, :3]).sum(-1), atol=2e-3, rtol=2e-3
    )


def test_interrupted_cache_build_resumes_to_the_same_arrays(
    teacher, tokenizer, text: Path, tmp_path: Path
) -> None:
    whole = _cache(teacher, tokenizer, text, tmp_path / "whole")
    assert _cache(teacher, tokenizer, text, tmp_path / "parts", stop_after_batches=1) == 2
    assert lm_cache.open_cache(tmp_path / "parts").tokens.shape[0] == 2  # only counted blocks are read
    assert _cache(teacher, tokenizer, text, tmp_path / "parts", max_blocks=3) == 3  # grow it a little
    assert _cache(teacher, tokenizer, text, tmp_path / "parts") == whole
    for name in ("tokens.npy", "values.npy", "indices.npy", "mass.npy"):
        assert np.array_equal(np.load(tmp_path / "whole" / name), np.load(tmp_path / "parts" / name))
    with pytest.raises(ValueError, match="holds teacher"):
        _cache(teacher, tokenizer, text, tmp_path / "parts", seed=1)


def test_raw_blocks_are_the_text_as_written_and_prose_blocks_its_lines(tokenizer, tmp_path: Path) -> None:
    written = " = Heading = \n\n" + "\n\n".join(CORPUS[:12]) + "\n"
    path = tmp_path / "raw.txt"
    path.write_text(written)
    raw = lm_cache.text_blocks(path, tokenizer, BLOCK, seed=None, raw=True)
    assert written.startswith(tokenizer.decode(raw.reshape(-1).tolist()))  # line breaks and headings kept
    prose = lm_cache.text_blocks(path, tokenizer, BLOCK, seed=None, raw=False)
    decoded = tokenizer.decode(prose.reshape(-1).tolist())
    assert "\n" not in decoded and "Heading" not in decoded and tokenizer.eos_token in decoded
    shuffled = lm_cache.text_blocks(path, tokenizer, BLOCK, seed=0, raw=True)
    assert sorted(map(tuple, shuffled.tolist())) == sorted(map(tuple, raw.tolist()))


def test_a_cache_keeps_the_form_it_was_built_in(teacher, tokenizer, text: Path, tmp_path: Path) -> None:
    _cache(teacher, tokenizer, text, tmp_path / "raw", raw=True, max_blocks=1)
    blocks = lm_cache.open_cache(tmp_path / "raw")
    assert blocks.meta.raw
    expected = lm_cache.text_blocks(text, tokenizer, BLOCK, seed=0, raw=True)[:1]
    assert np.array_equal(blocks.tokens, expected)
    with pytest.raises(ValueError, match="raw"):
        _cache(teacher, tokenizer, text, tmp_path / "raw", raw=False)  # continuing it as prose lines


def test_student_keeping_every_layer_equals_the_teacher(teacher) -> None:
    ids = torch.randint(0, teacher.config.vocab_size, (2, 12))
    same = distil_lm.student_from_teacher(teacher, distil_lm.DistilLMConfig(layers=4)).eval()
    with torch.no_grad():
        torch.testing.assert_close(same(input_ids=ids).logits, teacher(input_ids=ids).logits)
    config = distil_lm.DistilLMConfig(layers=2, layer_map=[1, 3])
    cut = distil_lm.student_from_teacher(teacher, config)
    assert cut.config.num_hidden_layers == 2
    for student_layer, teacher_layer in zip(cut.model.layers, (1, 3), strict=True):
        for a, b in zip(
            student_layer.parameters(), teacher.model.layers[teacher_layer].parameters(), strict=True
        ):
            assert torch.equal(a, b)
    assert torch.equal(cut.model.norm.weight, teacher.model.norm.weight)
    assert torch.equal(cut.lm_head.weight, teacher.lm_head.weight)
    assert (
        distil_lm.student_from_teacher(teacher, distil_lm.DistilLMConfig(layers=2)).config.num_hidden_layers
        == 2
    )


def test_an_earlier_student_is_continued_with_its_own_layers(teacher, tokenizer, tmp_path: Path) -> None:
    first = distil_lm.DistilLMConfig(layers=2, layer_map=[1, 3])
    student = distil_lm.student_from_teacher(teacher, first)
    student.save_pretrained(tmp_path / "v1")
    (tmp_path / "v1" / "train_state.json").write_text(json.dumps({"config": asdict(first)}))
    again = distil_lm.DistilLMConfig(layers=10, student_init=str(tmp_path / "v1"), freeze_embeddings=True)
    continued = distil_lm.student_from_teacher(teacher, again)
    assert (again.layers, again.layer_map) == (2, [1, 3])  # the earlier student's, not the flags'
    ids = torch.arange(12)[None]
    with torch.no_grad():
        torch.testing.assert_close(continued(ids).logits, student(ids).logits)
    assert not continued.get_input_embeddings().weight.requires_grad
    wider = tiny_llama(len(tokenizer), num_hidden_layers=2, hidden_size=48)
    with pytest.raises(ValueError, match="not a student of this teacher: its hidden_size"):
        distil_lm.student_from_teacher(wider, distil_lm.DistilLMConfig(student_init=str(tmp_path / "v1")))


def test_top_k_loss_is_the_full_kl_when_k_is_the_vocabulary() -> None:
    torch.manual_seed(0)
    student, teacher = torch.randn(2, 5, 11), torch.randn(2, 5, 11) * 3
    labels = torch.randint(0, 11, (2, 5))
    labels[0, 0] = -100
    values, indices = teacher.topk(11, dim=-1)
    full = distillation_loss(student, teacher, labels, temperature=2.0, alpha_kd=1.0, alpha_hard=0.5)
    top = top_k_distillation_loss(
        student, values, indices, labels, temperature=2.0, alpha_kd=1.0, alpha_hard=0.5
    )
    torch.testing.assert_close(top.kd, full.kd)
    torch.testing.assert_close(top.total, full.total)
    partial = top_k_distillation_loss(
        student, *teacher.topk(3, dim=-1), labels, temperature=1, alpha_kd=1, alpha_hard=0
    )
    assert float(partial.kd) >= 0


def test_top_k_loss_with_the_teachers_rest_is_the_kl_over_k_plus_one_classes() -> None:
    torch.manual_seed(0)
    vocab, k = 11, 3
    student = torch.randn(2, 5, vocab, requires_grad=True)
    teacher = torch.randn(2, 5, vocab) * 3
    labels = torch.randint(0, vocab, (2, 5))
    labels[0, 0] = -100
    values, indices = teacher.topk(k, dim=-1)
    p, q = teacher.softmax(-1).gather(-1, indices), student.softmax(-1).gather(-1, indices)
    coarse_p = torch.cat([p, 1 - p.sum(-1, keepdim=True)], dim=-1)  # k ids, then the rest
    coarse_q = torch.cat([q, 1 - q.sum(-1, keepdim=True)], dim=-1)
    expected = (coarse_p * (coarse_p.log() - coarse_q.log())).sum(-1)[labels != -100].mean()
    terms = top_k_distillation_loss(
        student, values, indices, labels, temperature=1, alpha_kd=1, alpha_hard=0, teacher_mass=p.sum(-1)
    )
    torch.testing.assert_close(terms.kd, expected)
    # k = V: the rest is empty and the loss is the full KL, with finite gradients
    everything = top_k_distillation_loss(
        student,
        *teacher.topk(vocab, dim=-1),
        labels,
        temperature=1,
        alpha_kd=1,
        alpha_hard=0,
        teacher_mass=torch.ones(2, 5),
    )
    full = distillation_loss(student, teacher, labels, temperature=1, alpha_kd=1, alpha_hard=0)
    torch.testing.assert_close(everything.kd, full.kd)
    everything.kd.backward()
    assert torch.isfinite(student.grad).all()
    with pytest.raises(ValueError, match="temperature 1"):
        top_k_distillation_loss(
            student, values, indices, labels, temperature=2, alpha_kd=1, alpha_hard=0, teacher_mass=p.sum(-1)
        )


def _rest_gap(student, blocks: lm_cache.CachedBlocks) -> float:
    """Mean |student's mass outside the teacher's top k - the teacher's| over the cache."""
    batch = blocks.batch(np.arange(len(blocks)))
    with torch.no_grad():
        probabilities = student(input_ids=batch["input_ids"]).logits.softmax(-1)
    student_rest = 1 - probabilities.gather(-1, batch["indices"]).sum(-1)
    return float((student_rest - (1 - batch["mass"])).abs().mean())


def test_kd_alone_keeps_the_teachers_mass_outside_its_top_k_only_with_the_rest_class(
    teacher, tokenizer, text: Path, tmp_path: Path
) -> None:
    """The renormalised top k teaches a student to put everything on the teacher's k ids; with the rest as
    a class it learns how much the teacher leaves outside them (the tiny teacher leaves most)."""
    _cache(teacher, tokenizer, text, tmp_path / "cache")
    blocks = lm_cache.open_cache(tmp_path / "cache")
    gaps = {}
    for kd_rest in (True, False):
        config = _config(steps=60, alpha_hard=0.0, kd_rest=kd_rest)
        torch.manual_seed(0)
        student = distil_lm.student_from_teacher(teacher, config)
        before = _rest_gap(student, blocks)
        distil_lm.train(student, blocks, config, tmp_path / f"run-{kd_rest}", checkpoint_every=1000)
        gaps[kd_rest] = _rest_gap(student, blocks)
    assert gaps[True] < 0.5 * before and gaps[False] > 2 * before  # measured: 0.066 -> 0.014 and 0.226


def test_a_cache_without_masses_still_trains_on_the_renormalised_top_k(
    teacher, tokenizer, text: Path, tmp_path: Path
) -> None:
    _cache(teacher, tokenizer, text, tmp_path / "cache", max_blocks=2)
    (tmp_path / "cache" / "mass.npy").unlink()  # as a format-1 cache is
    blocks = lm_cache.open_cache(tmp_path / "cache")
    assert blocks.mass is None and "mass" not in blocks.batch(np.arange(2))
    assert (
        distil_lm.train(distil_lm.student_from_teacher(teacher, _config()), blocks, _config(), tmp_path / "r")
        == 6
    )
    assert _cache(teacher, tokenizer, text, tmp_path / "cache", max_blocks=3) == 3  # continued, still without


def _config(**overrides: object) -> distil_lm.DistilLMConfig:
    settings: dict = {
        "layers": 2,
        "steps": 6,
        "batch_size": 2,
        "lr": 3e-3,
        "warmup_steps": 1,
        "alpha_hard": 0.1,
    }
    return distil_lm.DistilLMConfig(**{**settings, **overrides})


def _mean_kd(student, blocks: lm_cache.CachedBlocks, config: distil_lm.DistilLMConfig) -> float:
    with torch.no_grad():
        return float(distil_lm.cached_kd_loss(student, blocks.batch(np.arange(len(blocks))), config).kd)


def test_training_from_the_cache_lowers_the_distillation_loss(
    teacher, tokenizer, text: Path, tmp_path: Path
) -> None:
    _cache(teacher, tokenizer, text, tmp_path / "cache")
    blocks = lm_cache.open_cache(tmp_path / "cache")
    config = _config(steps=15)
    torch.manual_seed(0)
    student = distil_lm.student_from_teacher(teacher, config)
    before = _mean_kd(student, blocks, config)
    assert distil_lm.train(student, blocks, config, tmp_path / "run") == 15
    assert _mean_kd(student, blocks, config) < 0.85 * before
    assert (tmp_path / "run" / distil_lm.CHECKPOINT).exists()


def test_frozen_embeddings_keep_the_teachers_while_the_layers_learn(
    teacher, tokenizer, text: Path, tmp_path: Path
) -> None:
    _cache(teacher, tokenizer, text, tmp_path / "cache")
    blocks = lm_cache.open_cache(tmp_path / "cache")
    config = _config(steps=15, freeze_embeddings=True)
    student = distil_lm.student_from_teacher(teacher, config)
    first_layer = student.model.layers[0].mlp.up_proj.weight.detach().clone()
    before = _mean_kd(student, blocks, config)
    distil_lm.train(student, blocks, config, tmp_path / "run")
    assert _mean_kd(student, blocks, config) < 0.9 * before
    assert torch.equal(student.get_input_embeddings().weight, teacher.get_input_embeddings().weight)
    assert student.get_output_embeddings().weight is student.get_input_embeddings().weight  # still tied
    assert not torch.equal(student.model.layers[0].mlp.up_proj.weight, first_layer)


def test_interrupted_training_resumes_to_the_same_weights(
    teacher, tokenizer, text: Path, tmp_path: Path
) -> None:
    _cache(teacher, tokenizer, text, tmp_path / "cache")
    blocks = lm_cache.open_cache(tmp_path / "cache")

    def run(out: Path, stop: int | None) -> distil_lm.PreTrainedModel:
        config = _config()
        student = distil_lm.student_from_teacher(teacher, config)
        distil_lm.train(student, blocks, config, out, stop_after_steps=stop, checkpoint_every=100)
        return student

    def step(out: Path) -> object:
        state = distil_lm.load_checkpoint(out)
        return None if state is None else state["step"]

    whole = run(tmp_path / "whole", None)
    assert step(tmp_path / "whole") == 6
    run(tmp_path / "parts", 4)
    assert step(tmp_path / "parts") == 4
    resumed = run(tmp_path / "parts", None)  # a fresh student: all state comes from the checkpoint
    for (name, a), b in zip(whole.state_dict().items(), resumed.state_dict().values(), strict=True):
        assert torch.equal(a, b), name


def test_micro_batches_cover_each_epoch_once() -> None:
    rows = np.concatenate([distil_lm.micro_batch_rows(i, 3, 7, seed=0) for i in range(7)])  # 3 epochs of 7
    for epoch in range(3):
        assert sorted(rows[epoch * 7 : epoch * 7 + 7]) == list(range(7))
    assert not np.array_equal(rows[:7], rows[7:14])


def test_perplexity_matches_a_direct_computation(teacher) -> None:
    blocks = torch.randint(0, teacher.config.vocab_size, (5, 12))
    result = distil_lm.perplexity(teacher, blocks, batch_size=2)
    with torch.no_grad():
        logits = teacher(input_ids=blocks).logits[:, :-1]
        nll = F.cross_entropy(logits.reshape(-1, logits.size(-1)), blocks[:, 1:].reshape(-1))
    assert result["tokens"] == 5 * 11
    assert math.isclose(result["perplexity"], math.exp(float(nll)), rel_tol=1e-5)


def test_position_windows_double_and_cover_every_predicted_position() -> None:
    assert distil_lm.position_windows(12) == [(1, 12)]
    assert distil_lm.position_windows(300) == [(1, 64), (64, 128), (128, 256), (256, 300)]
    windows = distil_lm.position_windows(2048)
    assert windows[0][0] == 1 and windows[-1] == (1024, 2048)
    assert all(a[1] == b[0] for a, b in itertools.pairwise(windows))


def test_perplexity_by_position_matches_each_window_computed_directly(teacher) -> None:
    blocks = torch.randint(0, teacher.config.vocab_size, (3, 150))
    result = distil_lm.perplexity(teacher, blocks, batch_size=2)
    with torch.no_grad():
        logits = teacher(input_ids=blocks).logits[:, :-1]
        nll = F.cross_entropy(logits.transpose(1, 2), blocks[:, 1:], reduction="none")  # [3, 149]
    assert [(w["from"], w["to"]) for w in result["by_position"]] == [(1, 64), (64, 128), (128, 150)]
    for window in result["by_position"]:
        direct = math.exp(float(nll[:, window["from"] - 1 : window["to"] - 1].mean()))
        assert math.isclose(window["perplexity"], direct, rel_tol=1e-5)


def test_cli_caches_distils_resumes_and_evaluates(tmp_path: Path, text: Path) -> None:
    teacher_dir = build_tiny_llama(tmp_path / "teacher")
    runner = CliRunner()
    cache, out = tmp_path / "cache", tmp_path / "student"
    common = ["--teacher", str(teacher_dir), "--threads", "1"]
    cache_with_cli(teacher_dir, text, cache, BLOCK, K)
    train = [
        "distil-lm",
        *common,
        "--cache",
        str(cache),
        "--out",
        str(out),
        "--layers",
        "1",
        "--batch-size",
        "2",
    ]
    result = runner.invoke(app, [*train, "--steps", "3", "--time-limit", "0"])  # stops after one step
    assert result.exit_code == 0, result.output
    assert "step 1/3" in result.output and "run again" in result.output
    result = runner.invoke(app, [*train, "--steps", "99"])  # resumes: the checkpoint's settings win
    assert result.exit_code == 0, result.output
    assert "resuming" in result.output and "step 3/3 (done)" in result.output
    result = runner.invoke(
        app,
        [
            "eval-lm",
            *common,
            "--student",
            str(out),
            "--eval",
            str(text),
            "--block-size",
            str(BLOCK),
            "--eval-blocks",
            "3",
            "--decode-tokens",
            "2",
            "--raw",
        ],
    )
    assert result.exit_code == 0, result.output
    assert "student/teacher perplexity" in result.output
    assert (out / "lm_eval.json").exists() and (out / "config.json").exists()
    summary = json.loads((out / "lm_eval.json").read_text())
    assert 0.0 <= summary["agreement"] <= 1.0 and summary["raw"]
    (window,) = summary["by_position"]  # a short block is one window, the whole block's figures
    assert math.isclose(window["ratio"], summary["perplexity_ratio"], rel_tol=1e-9)
    assert "by_position" not in summary["teacher"]
    # export reads the pair from distill_report.json, as it does for the other tasks
    record = distillation_record(out)
    assert record is not None and record.metric == "perplexity"
    assert record.teacher.score == summary["teacher"]["perplexity"]
    assert record.student.score == summary["student"]["perplexity"]
    assert record.agreement == summary["agreement"] and record.teacher.source == str(teacher_dir)

    # continued from that student (on any cache of the teacher): its layers, its weights at the start
    again = [
        "distil-lm",
        *common,
        "--cache",
        str(cache),
        "--out",
        str(tmp_path / "again"),
        "--student-init",
        str(out),
    ]
    refused = runner.invoke(app, [*again, "--layer-map", "0"])
    assert refused.exit_code == 2 and "keeps its own layers" in refused.output
    result = runner.invoke(app, [*again, "--steps", "1", "--lr", "0", "--batch-size", "2"])
    assert result.exit_code == 0, result.output
    before = AutoModelForCausalLM.from_pretrained(out).state_dict()
    after = AutoModelForCausalLM.from_pretrained(tmp_path / "again").state_dict()
    assert all(torch.equal(before[name], after[name]) for name in before)  # learning rate 0: unchanged
    state = json.loads((tmp_path / "again" / "train_state.json").read_text())
    assert state["config"]["student_init"] == str(out) and state["config"]["layers"] == 1
    assert "renormalised" not in result.output  # the cache records the masses, T = 1: the rest is a class
    warm = ["distil-lm", *common, "--cache", str(cache), "--out", str(tmp_path / "warm"), "--layers", "1"]
    result = runner.invoke(app, [*warm, "--batch-size", "2", "--steps", "1", "--temperature", "2"])
    assert (
        result.exit_code == 0 and "renormalised" in result.output and "temperature is not 1" in result.output
    )
