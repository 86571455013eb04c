"""The teacher's copying circuit found from its attention, and the student's layer map that keeps it."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from transformers import AutoModelForCausalLM
from typer.testing import CliRunner

from tests.tiny_models import CORPUS, llama_bpe, tiny_llama
from tests.training.lm_cli import cache_with_cli
from training import circuits
from training.cli import app


def test_scores_read_induction_and_previous_token_patterns() -> None:
    span = 5
    size = 2 * span
    induction = torch.zeros(size, size)
    previous = torch.zeros(size, size)
    uniform = torch.tril(torch.ones(size, size))
    uniform /= uniform.sum(-1, keepdim=True)
    for query in range(size):
        induction[query, query - span + 1 if query >= span else 0] = 1.0  # on the repeat: what followed
        previous[query, max(query - 1, 0)] = 1.0
    attentions = torch.stack([induction, previous, uniform])[None]  # [1 sequence, 3 heads, T, T]
    on_repeat = [1 / (query + 1) for query in range(span, size - 1)]  # uniform: 1/(q+1) on every key
    assert circuits.induction_scores(attentions, span).tolist() == pytest.approx(
        [1.0, 0.0, sum(on_repeat) / 4]
    )
    after_first = [1 / (query + 1) for query in range(1, size)]
    expected = [1 / 9, 1.0, sum(after_first) / 9]  # the induction head's only previous-token hit: query 1
    assert circuits.previous_token_scores(attentions).tolist() == pytest.approx(expected)


def test_layer_map_keeps_the_circuit_then_fills_the_widest_gaps() -> None:
    induction = [0.0] * 12
    previous = [0.0] * 12
    induction[7], induction[9], induction[4] = 0.9, 0.5, 0.2  # heads at 7 and 9; 0.2 is below the floor
    previous[2], previous[6], previous[3] = 0.8, 0.7, 0.4
    previous[8] = 0.95  # after the first induction head: it cannot feed it
    scores = circuits.CircuitScores(induction=induction, previous_token=previous)
    assert circuits.circuit_layer_map(scores, 1) == [0]
    assert circuits.circuit_layer_map(scores, 3) == [0, 7, 11]  # the ends, then the surest head
    assert circuits.circuit_layer_map(scores, 6) == [0, 2, 6, 7, 9, 11]  # then its writers, surest first
    assert circuits.circuit_layer_map(scores, 8) == [0, 1, 2, 4, 6, 7, 9, 11]  # then gaps 2..6, 0..2
    assert circuits.circuit_layer_map(scores, 12) == list(range(12))
    with pytest.raises(ValueError, match=r"1\.\.12 layers"):
        circuits.circuit_layer_map(scores, 13)


def _copying_llama(vocab_size: int, layers: int, steps: int = 120) -> torch.nn.Module:
    """A tiny Llama trained to continue random tokens by repeating them: it grows an induction head."""
    torch.manual_seed(0)
    model = tiny_llama(vocab_size, positions=160, num_hidden_layers=layers)
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-3)
    span = 12
    for _ in range(steps):
        tokens = torch.randint(vocab_size // 10, vocab_size, (32, span))
        ids = torch.cat([tokens, tokens], dim=1)
        logits = model(input_ids=ids).logits[:, span - 1 : -1]
        F.cross_entropy(logits.reshape(-1, vocab_size), ids[:, span:].reshape(-1)).backward()
        optimizer.step()
        optimizer.zero_grad()
    return model.eval()


@pytest.fixture(scope="module")
def copier(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, circuits.CircuitScores]:
    """A 4-layer copier saved as a teacher directory, and its scores on spans like those it learned."""
    tokenizer = llama_bpe()
    model = _copying_llama(len(tokenizer), layers=4)
    out = tmp_path_factory.mktemp("copier")
    model.save_pretrained(out)
    tokenizer.save_pretrained(out)
    return out, circuits.circuit_scores(model, span=12)


def test_a_model_trained_to_copy_shows_its_induction_head(
    copier: tuple[Path, circuits.CircuitScores],
) -> None:
    induction = copier[1].induction
    head = max(range(4), key=induction.__getitem__)
    assert induction[head] > 0.8 and head > 0  # the first layer cannot look for a match: nothing is there yet
    untrained = tiny_llama(len(llama_bpe()), num_hidden_layers=4)
    kernel = untrained.config._attn_implementation
    assert max(circuits.circuit_scores(untrained, span=12).induction) < circuits.INDUCTION_MIN
    assert untrained.config._attn_implementation == kernel  # scoring switched to eager and back


def test_cli_names_the_circuit_and_distil_lm_cuts_through_it(
    copier: tuple[Path, circuits.CircuitScores], tmp_path: Path
) -> None:
    teacher, scores = copier
    head = max(range(4), key=scores.induction.__getitem__)
    runner = CliRunner()
    common = ["--teacher", str(teacher), "--threads", "1"]
    result = runner.invoke(app, ["lm-circuits", *common, "--layers", "1,3", "--span", "12"])
    assert result.exit_code == 0, result.output
    assert f"{head:5d}" in result.output and "induction head" in result.output
    chosen = circuits.circuit_layer_map(scores, 3)
    assert head in chosen  # the ends and the head
    assert "1 layers: --layer-map 0\n" in result.output
    assert f"3 layers: --layer-map {','.join(map(str, chosen))}\n" in result.output
    bad = runner.invoke(app, ["lm-circuits", *common, "--layers", "two"])
    assert bad.exit_code == 2 and "comma-separated depths" in bad.output

    text = tmp_path / "train.txt"
    text.write_text("\n".join(CORPUS[:24]) + "\n")
    cache, student = tmp_path / "cache", tmp_path / "student"
    cache_with_cli(teacher, text, cache, 16, 4)
    result = runner.invoke(
        app,
        [
            "distil-lm", *common, "--cache", str(cache), "--out", str(student), "--layers", "3",
            "--layer-map", "circuits", "--steps", "1", "--batch-size", "2",
        ],
    )  # fmt: skip
    assert result.exit_code == 0, result.output
    state = json.loads((student / "train_state.json").read_text())
    model = AutoModelForCausalLM.from_pretrained(teacher)
    assert state["config"]["layer_map"] == circuits.circuit_layer_map(circuits.circuit_scores(model), 3)
