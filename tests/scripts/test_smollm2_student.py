"""scripts/device/smollm2_student.sh end to end on this CPU with a tiny GGUF teacher: every step a lent GPU
would run (import, the teacher's continuations, the cache, two recipes side by side, scoring, packing), in
the two calls a long run takes, so a mistake in the script costs a test run here, not a GPU's minutes."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from transformers import AutoModelForCausalLM

from tests.tiny_models import CORPUS, llama_bpe, tiny_llama
from tests.training.tiny_gguf import write_tiny_gguf

ROOT = Path(__file__).parents[2]
SCRIPT = ROOT / "scripts" / "device" / "smollm2_student.sh"


def test_the_device_script_distils_scores_and_packs_the_best(tmp_path: Path) -> None:
    pytest.importorskip("gguf")
    tokenizer = llama_bpe()
    gguf_file = tmp_path / "tiny.Q4_1.gguf"
    write_tiny_gguf(tiny_llama(len(tokenizer), positions=256, std=0.2), tokenizer, gguf_file)
    data = tmp_path / "data"
    data.mkdir()
    (data / "wikitext2_raw_train.txt").write_text("\n".join(CORPUS * 2) + "\n")
    (data / "wikitext2_raw_valid.txt").write_text("\n".join(reversed(CORPUS)) + "\n")
    work, out = tmp_path / "work", tmp_path / "out"
    env = {
        **os.environ,
        "PY": sys.executable,
        "LAYERS": "1",
        "BLOCK": "64",  # the knob a long-context student turns the other way (2048)
        "EVAL_BLOCKS": "64 32",  # scored at its own length, then at a shorter one
        "RAW": "1",  # the text as written, line breaks kept, for the cache and the scores
        "BATCH": "2",
        "STEPS_PER_S": "0.0365",  # a rate known before: no probe; 2 steps = rate x TRAIN_S x 0.55 (two runs)
        "TRAIN_S": "100",
        "LR": "1e-2",  # two steps apart from the same start: far enough to tell the recipes apart
        "GEN_PROMPTS": "6",
        "GEN_BATCH": "3",
        "GEN_PROMPT_TOKENS": "4",
        "GEN_NEW_TOKENS": "24",
        "GEN_TEMPERATURE": "0.5",
        "GEN_S": "600",
        # mixed copies the teacher's last layer, not its first, and matches that layer's attention too
        "RECIPES": "kd:1:0 mixed:1:1:1:0.5",
        "ATTENTION_LAYERS": "1",
        "OMP_NUM_THREADS": "1",
    }

    def run(**knobs: str) -> str:
        result = subprocess.run(
            ["bash", str(SCRIPT), str(gguf_file), str(data), str(work), str(out)],
            cwd=ROOT,
            env={**env, **knobs},
            capture_output=True,
            text=True,
            timeout=600,
        )
        assert result.returncode == 0, result.stdout + result.stderr
        return result.stdout

    # two calls, as a lent machine's 10-minute limit asks of a long generation: the text and its cache first
    first = run(STOP_AFTER="cache")
    assert "generated" in first and "cached" in first and "trained" not in first
    generated = (work / "generated.txt").read_text().splitlines()
    assert len(generated) >= 6
    progress = json.loads((work / "generated.txt.progress.json").read_text())
    assert progress["settings"]["temperature"] == 0.5
    assert not (work / "kd").exists()
    # a deadline that leaves no time to train, score and pack is refused before any training starts
    refused = subprocess.run(
        ["bash", str(SCRIPT), str(gguf_file), str(data), str(work), str(out)],
        cwd=ROOT,
        env={**env, "DEADLINE_S": "60"},
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert refused.returncode != 0 and "left for training" in refused.stderr, refused.stderr
    assert not (work / "kd").exists()
    # then the same command trains on that cache: no more text (the cache fixed it), no second import;
    # a deadline far off leaves training its own limit (TRAIN_S x 1.3)
    second = run(DEADLINE_S="100000")
    assert "generated" not in second and "LlamaForCausalLM" not in second and "packing" in second
    assert "training stops within 130 s" in second
    assert (work / "generated.txt").read_text().splitlines() == generated
    meta = json.loads((work / "cache" / "meta.json").read_text())
    assert Path(meta["source"]).name == "train-plus-generated.txt"  # the cache covers both texts
    assert meta["block_size"] == 64 and meta["raw"] and (work / "cache" / "mass.npy").exists()
    ratios = {}
    for name, layer_map in (("kd", [0]), ("mixed", [1])):
        state = json.loads((work / name / "train_state.json").read_text())
        assert state["step"] == 2
        assert state["config"]["layer_map"] == layer_map
        assert state["config"]["kd_rest"]  # the cache records the mass outside the top k: it is used
        assert state["config"]["alpha_attention"] == (0.5 if name == "mixed" else 0.0)
        scores = {size: json.loads((work / name / f"lm_eval-{size}.json").read_text()) for size in (64, 32)}
        assert [(scores[size]["block_size"], scores[size]["raw"]) for size in (64, 32)] == [
            (64, True),
            (32, True),
        ]
        assert json.loads((work / name / "lm_eval.json").read_text()) == scores[64]  # the first picks
        ratios[name] = scores[64]["perplexity_ratio"]

    best = min(ratios, key=ratios.__getitem__)
    spec = importlib.util.spec_from_file_location("pack_student", SCRIPT.with_name("pack_student.py"))
    assert spec is not None and spec.loader is not None
    pack_student = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(pack_student)
    pack_student.unpack(out, work / "teacher", tmp_path / "back")
    ids = torch.arange(12)[None]
    with torch.no_grad():
        back = AutoModelForCausalLM.from_pretrained(tmp_path / "back")(ids).logits
        gap = {
            name: float((AutoModelForCausalLM.from_pretrained(work / name)(ids).logits - back).abs().max())
            for name in ratios
        }
    other = next(name for name in ratios if name != best)
    assert gap[best] < 3e-2 < gap[other], gap  # the best recipe came back, as float16 weights
    assert json.loads((tmp_path / "back" / "lm_eval-32.json").read_text()) == json.loads(
        (work / best / "lm_eval-32.json").read_text()
    )  # with every score it was given
