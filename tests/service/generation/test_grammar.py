"""Structured output: a JSON schema every generated token keeps the text inside. Greedy text equals PyTorch's
greedy loop masked by an independent llguidance matcher; sampled text always parses and fits the schema;
drafted by a student, greedy text is the teacher's and sampled text still fits; a bad schema is refused."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from service.generation.grammar import Grammars, json_grammar
from service.generation.runner import DecoderRunner
from service.generation.sampling import SamplingParams
from service.generation.scheduler import StepPlan
from service.generation.sequence import Sequence
from service.generation.speculative import SpeculativeRunner
from service.repository import read_version
from tests.service.generation.conftest import Loaded
from tests.service.generation.helpers import PROMPTS, alone, ids

SCHEMA = {
    "type": "object",
    "properties": {
        "mood": {"type": "string", "enum": ["good", "bad", "so-so"]},
        "stars": {"type": "integer", "minimum": 1, "maximum": 5},
    },
    "required": ["mood", "stars"],
    "additionalProperties": False,
}
NEW_TOKENS = 40  # more than any answer the schema allows takes


def fits(text: str) -> bool:
    value = json.loads(text)
    return (
        set(value) == {"mood", "stars"}
        and value["mood"] in ("good", "bad", "so-so")
        and isinstance(value["stars"], int)
        and 1 <= value["stars"] <= 5
    )


def test_a_schema_compiles_and_a_bad_one_says_why() -> None:
    assert "json_schema" in json_grammar(SCHEMA) and "json_schema" in json_grammar(None)
    with pytest.raises(ValueError, match=r"the schema cannot be compiled: .*nonsense"):
        json_grammar({"type": "nonsense"})


def torch_greedy_masked(model: Any, tokenizer_file: Path, prompt: list[int], eos: int) -> list[int]:
    """The reference: full forward passes; each step's logits masked by its own llguidance matcher."""
    import llguidance
    import llguidance.numpy
    import torch

    tokenizer = llguidance.LLTokenizer(tokenizer_file.read_text(), eos_token=[eos])
    matcher = llguidance.LLMatcher(tokenizer, json_grammar(SCHEMA))
    bits = llguidance.numpy.allocate_token_bitmask(1, tokenizer.vocab_size)
    input_ids = torch.tensor([prompt])
    with torch.no_grad():
        for _ in range(NEW_TOKENS):
            logits = model(input_ids).logits[0, -1].float().numpy().copy()
            llguidance.numpy.fill_next_token_bitmask(matcher, bits)
            llguidance.numpy.apply_token_bitmask_inplace(logits, bits[0])
            token = int(np.argmax(logits))
            matcher.consume_token(token)
            input_ids = torch.cat([input_ids, torch.tensor([[token]])], dim=1)
            if token == eos:
                break
    return [int(t) for t in input_ids[0, len(prompt) :]]


@pytest.fixture(scope="module")
def gpt2_grammars(tiny_repository: Path) -> Grammars:
    version = read_version(tiny_repository / "tiny-lm" / "1")
    layout = version.manifest.generation
    assert layout is not None
    return Grammars(version.file(version.manifest.tokenizer.file), layout.stop_ids())


def test_greedy_json_equals_pytorch_masked_by_the_same_grammar(
    parts: tuple[Any, ...], tiny_models: dict[str, Path], tiny_repository: Path, gpt2_grammars: Grammars
) -> None:
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(tiny_models["text-generation"]).eval()
    version = read_version(tiny_repository / "tiny-lm" / "1")
    tokenizer_file = version.file(version.manifest.tokenizer.file)
    eos = parts[1].eos_token_id
    params = SamplingParams(max_new_tokens=NEW_TOKENS, grammar=json_grammar(SCHEMA))
    for text in PROMPTS[:4]:
        prompt = ids(parts, text)
        expected = torch_greedy_masked(model, tokenizer_file, prompt, eos)
        assert expected[-1] == eos and fits(parts[2].decode(expected[:-1]))
        assert alone(parts, prompt, params, grammars=gpt2_grammars) == expected


def test_sampled_json_always_fits_the_schema(parts: tuple[Any, ...], gpt2_grammars: Grammars) -> None:
    prompt = ids(parts, PROMPTS[2])
    texts = set()
    for seed in range(12):
        params = SamplingParams(
            max_new_tokens=NEW_TOKENS, temperature=1.5, seed=seed, grammar=json_grammar(SCHEMA)
        )
        out = alone(parts, prompt, params, grammars=gpt2_grammars)
        assert out[-1] == parts[1].eos_token_id
        texts.add(parts[2].decode(out[:-1]))
    assert all(fits(t) for t in texts) and len(texts) > 3  # sampled: several different answers


def drive(
    runner: DecoderRunner | SpeculativeRunner,
    prompts: list[list[int]],
    params: SamplingParams,
    grammars: Grammars,
    eos: int,
) -> list[list[int]]:
    """All prompts in one running batch, each with its own matcher (advanced as the engine thread does),
    until each says eos or reaches its length."""
    seqs = [Sequence(prompt=p, params=params) for p in prompts]
    for s in seqs:
        s.grammar = grammars.start(json_grammar(SCHEMA))
    plan = StepPlan(prefill=seqs, decode=[])
    while plan.prefill or plan.decode:
        result = runner.execute(plan)
        for s in [*plan.prefill, *plan.decode]:
            for token in (result.tokens[s.id], *result.more.get(s.id, ())):
                if (s.output and s.output[-1] == eos) or len(s.output) >= params.max_new_tokens:
                    break
                s.output.append(token)
                assert s.grammar is not None
                s.grammar.advance(token)
        running = [s for s in seqs if s.output[-1] != eos and len(s.output) < params.max_new_tokens]
        plan = StepPlan(prefill=[], decode=running)
    return [s.output for s in seqs]


@pytest.fixture(scope="module")
def pair_grammars(lm_pair: Path) -> Grammars:
    version = read_version(lm_pair / "lm-teacher" / "1")
    assert version.manifest.generation is not None
    return Grammars(version.file(version.manifest.tokenizer.file), version.manifest.generation.stop_ids())


PAIR_PROMPTS = [[5, 9, 13, 2], [7, 7, 7], [100, 20, 30, 40, 50, 60], [3]]


@pytest.mark.parametrize("k", [1, 4])
def test_drafted_greedy_json_is_the_teachers_own(loaded: Loaded, pair_grammars: Grammars, k: int) -> None:
    eos = loaded["lm-teacher"][1].eos_token_id
    params = SamplingParams(max_new_tokens=NEW_TOKENS, grammar=json_grammar(SCHEMA))
    expected = drive(DecoderRunner(*loaded["lm-teacher"]), PAIR_PROMPTS, params, pair_grammars, eos)
    assert all(out[-1] == eos for out in expected)
    speculative = SpeculativeRunner(DecoderRunner(*loaded["lm-teacher"]), DecoderRunner(*loaded["lm"]), k, 64)
    assert drive(speculative, PAIR_PROMPTS, params, pair_grammars, eos) == expected


def test_drafted_sampled_json_fits_the_schema(loaded: Loaded, pair_grammars: Grammars, lm_pair: Path) -> None:
    from tokenizers import Tokenizer

    tokenizer = Tokenizer.from_file(str(lm_pair / "lm-teacher" / "1" / "tokenizer.json"))
    eos = loaded["lm-teacher"][1].eos_token_id
    speculative = SpeculativeRunner(DecoderRunner(*loaded["lm-teacher"]), DecoderRunner(*loaded["lm"]), 3, 64)
    for seed in range(6):
        params = SamplingParams(
            max_new_tokens=NEW_TOKENS, temperature=1.2, seed=seed, grammar=json_grammar(SCHEMA)
        )
        for out in drive(speculative, PAIR_PROMPTS, params, pair_grammars, eos):
            assert out[-1] == eos and fits(tokenizer.decode(out[:-1]))
