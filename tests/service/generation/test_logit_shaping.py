"""A request's logit bias and penalties (OpenAI's presence and frequency penalties and logit_bias, HF's
repetition penalty) in the engine: greedy text equals PyTorch's greedy loop through transformers' own
processors (and OpenAI's formula as a processor), alone and inside a running batch, on both decoder graphs;
drafted by a student, greedy text is the teacher's and sampled text keeps the teacher's distribution."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from service.generation.runner import DecoderRunner
from service.generation.sampling import SamplingParams
from service.generation.speculative import SpeculativeRunner
from tests.service.generation.conftest import Loaded
from tests.service.generation.helpers import PROMPTS, alone, ids, together
from tests.service.generation.test_speculative import REQUESTS, generate, one_distribution, sampled_openings

NEW_TOKENS = 16
SHAPINGS = {
    "presence": {"presence_penalty": 1.5},
    "frequency": {"frequency_penalty": 0.7},
    "negative-frequency": {"frequency_penalty": -0.4},
    "bias": {"logit_bias": ((5, 3.0), (7, -100.0), (11, 1.5))},
    "all": {
        "repetition_penalty": 1.2,
        "presence_penalty": 0.5,
        "frequency_penalty": 0.3,
        "logit_bias": ((5, 2.0), (9, -1.0)),
    },
}


def torch_greedy(
    model: Any, prompt: list[int], shaping: dict[str, Any], eos: int | None, new_tokens: int = NEW_TOKENS
) -> list[int]:
    """The reference: full forward passes, each step's last logits through transformers' bias and
    repetition processors, then OpenAI's penalties on the output's counts, argmax; vLLM's order."""
    import torch
    from transformers import (
        LogitsProcessorList,
        RepetitionPenaltyLogitsProcessor,
        SequenceBiasLogitsProcessor,
    )

    processors = LogitsProcessorList()
    if shaping.get("logit_bias"):
        processors.append(SequenceBiasLogitsProcessor({(t,): b for t, b in shaping["logit_bias"]}))
    if shaping.get("repetition_penalty", 1.0) != 1.0:
        processors.append(RepetitionPenaltyLogitsProcessor(shaping["repetition_penalty"]))
    input_ids = torch.tensor([prompt])
    with torch.no_grad():
        for _ in range(new_tokens):
            scores = processors(input_ids, model(input_ids).logits[:, -1].float())
            output = input_ids[:, len(prompt) :]
            counts = torch.zeros_like(scores).scatter_add_(
                1, output, torch.ones_like(output, dtype=scores.dtype)
            )
            scores = (
                scores
                - shaping.get("frequency_penalty", 0.0) * counts
                - shaping.get("presence_penalty", 0.0) * (counts > 0)
            )
            token = int(scores.argmax(dim=-1))
            input_ids = torch.cat([input_ids, torch.tensor([[token]])], dim=1)
            if token == eos:
                break
    return [int(t) for t in input_ids[0, len(prompt) :]]


@pytest.mark.parametrize("shaping", list(SHAPINGS.values()), ids=list(SHAPINGS))
def test_greedy_text_equals_pytorch_with_the_same_bias_and_penalties(
    parts: tuple[Any, ...], tiny_models: dict[str, Path], shaping: dict[str, Any]
) -> None:
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(tiny_models["text-generation"]).eval()
    layout = parts[1]
    prompts = [ids(parts, text) for text in PROMPTS[:4]]
    expected = [torch_greedy(model, p, shaping, layout.eos_token_id) for p in prompts]
    plain = [torch_greedy(model, p, {}, layout.eos_token_id) for p in prompts]
    assert expected != plain  # the shaping changes the text: the comparison below checks it
    params = SamplingParams(max_new_tokens=NEW_TOKENS, **shaping)
    assert [alone(parts, p, params) for p in prompts] == expected
    assert together(parts, prompts, params) == expected


def test_a_banned_token_is_never_drawn_and_a_forced_one_always(parts: tuple[Any, ...]) -> None:
    prompt = ids(parts, PROMPTS[1])
    free = SamplingParams(max_new_tokens=NEW_TOKENS, temperature=1.5, seed=3, ignore_eos=True)
    drawn = alone(parts, prompt, free)
    banned = tuple((t, -100.0) for t in set(drawn))
    again = alone(parts, prompt, SamplingParams(**{**free.__dict__, "logit_bias": banned}))
    assert not set(again) & set(drawn)
    forced = alone(parts, prompt, SamplingParams(**{**free.__dict__, "logit_bias": ((42, 100.0),)}))
    assert forced == [42] * NEW_TOKENS


def test_drafted_greedy_with_bias_and_penalties_is_the_teachers_own(loaded: Loaded) -> None:
    shaping = SHAPINGS["all"]
    teacher = DecoderRunner(*loaded["lm-teacher"])
    expected = generate(teacher, REQUESTS, **shaping)
    assert expected != generate(DecoderRunner(*loaded["lm-teacher"]), REQUESTS)
    speculative = SpeculativeRunner(DecoderRunner(*loaded["lm-teacher"]), DecoderRunner(*loaded["lm"]), 3, 64)
    assert generate(speculative, REQUESTS, **shaping) == expected


def test_drafted_sampling_with_penalties_keeps_the_teachers_distribution(loaded: Loaded) -> None:
    """As test_speculative's chi-square test, with a frequency penalty and a bias: the draft's q and the
    teacher's p are both shaped by the tokens drafted before them, so the rule still keeps p."""
    shaping = {"frequency_penalty": 1.0, "logit_bias": ((5, 1.0),)}
    runner = SpeculativeRunner(DecoderRunner(*loaded["lm-teacher"]), DecoderRunner(*loaded["lm"]), 2, 64)
    drafted = sampled_openings(runner, range(1200), shaping=shaping)
    alone_ = sampled_openings(DecoderRunner(*loaded["lm-teacher"]), range(10_000, 11_200), shaping=shaping)
    plain = sampled_openings(DecoderRunner(*loaded["lm-teacher"]), range(20_000, 21_200))
    assert one_distribution(drafted, alone_)
    assert not one_distribution(plain, alone_)  # the penalty changes what is drawn: the test can fail


def test_shaped_rows_beside_plain_greedy_rows_keep_their_own_choices(loaded: Loaded) -> None:
    """One batch, some rows argmax-only and some shaped: each gets what it gets alone."""
    plain = generate(DecoderRunner(*loaded["lm-teacher"]), REQUESTS)
    shaped = generate(DecoderRunner(*loaded["lm-teacher"]), REQUESTS, **SHAPINGS["all"])
    mixed_params = [
        SamplingParams(max_new_tokens=n, **(SHAPINGS["all"] if i % 2 else {}))
        for i, (_, _, n) in enumerate(REQUESTS)
    ]
    mixed = generate(DecoderRunner(*loaded["lm-teacher"]), REQUESTS, params=mixed_params)
    assert mixed == [shaped[i] if i % 2 else plain[i] for i in range(len(REQUESTS))]
    assert plain != shaped


def test_min_tokens_holds_the_stop_tokens_back(parts: tuple[Any, ...]) -> None:
    eos = parts[1].eos_token_id
    prompt = ids(parts, PROMPTS[1])
    ending = SamplingParams(max_new_tokens=NEW_TOKENS, logit_bias=((eos, 100.0),))  # eos at once, unless held
    assert alone(parts, prompt, ending) == [eos]
    held = alone(parts, prompt, SamplingParams(**{**ending.__dict__, "min_tokens": 5}))
    assert len(held) == 6 and held[-1] == eos and eos not in held[:5]


def test_stop_token_ids_end_the_output_at_the_first_of_them(parts: tuple[Any, ...]) -> None:
    prompt = ids(parts, PROMPTS[2])
    plain = alone(parts, prompt, SamplingParams(max_new_tokens=NEW_TOKENS))
    at = next(i for i, t in enumerate(plain) if i >= 2 and t not in plain[:i])
    stopped = alone(parts, prompt, SamplingParams(max_new_tokens=NEW_TOKENS, stop_token_ids=(plain[at],)))
    assert stopped == plain[: at + 1]


def test_drafted_min_tokens_is_the_teachers_own(loaded: Loaded) -> None:
    eos = loaded["lm-teacher"][1].eos_token_id
    shaping = {"logit_bias": ((eos, 100.0),), "min_tokens": 4}
    stops = frozenset({eos})
    expected = generate(DecoderRunner(*loaded["lm-teacher"]), REQUESTS, stop_ids=stops, **shaping)
    assert all(out[: min(4, len(out))].count(eos) == 0 for out in expected)
    assert all(out[4:] == [eos] * (len(out) - 4) for out in expected)
    speculative = SpeculativeRunner(DecoderRunner(*loaded["lm-teacher"]), DecoderRunner(*loaded["lm"]), 3, 64)
    assert generate(speculative, REQUESTS, stop_ids=stops, **shaping) == expected
