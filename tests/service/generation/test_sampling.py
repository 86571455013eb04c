"""Sampling rules on hand-made logits."""

from __future__ import annotations

import warnings
from collections.abc import Iterator

import numpy as np
import pytest

from service.generation.sampling import (
    GREEDY_BELOW,
    SamplingParams,
    apply_repetition_penalty,
    next_token,
    scaled,
    shaped_scores,
    token_logprob,
)

LOGITS = np.array([1.0, 3.0, 2.0, -1.0, 0.5])


def test_greedy_takes_the_argmax() -> None:
    assert next_token(LOGITS, SamplingParams(), [], [], None) == 1


def test_top_k_1_and_tiny_top_p_are_greedy_even_when_sampling() -> None:
    rng = np.random.default_rng(0)
    for _ in range(20):
        assert next_token(LOGITS, SamplingParams(temperature=1.5, top_k=1), [], [], rng) == 1
        assert next_token(LOGITS, SamplingParams(temperature=1.5, top_p=1e-6), [], [], rng) == 1


def test_top_k_never_leaves_the_k_best() -> None:
    rng = np.random.default_rng(1)
    drawn = {next_token(LOGITS, SamplingParams(temperature=5.0, top_k=2), [], [], rng) for _ in range(200)}
    assert drawn == {1, 2}


def test_seeded_sampling_repeats() -> None:
    params = SamplingParams(temperature=1.0, seed=42)
    first = [next_token(LOGITS, params, [], [], np.random.default_rng(42)) for _ in range(1)]
    rng_a, rng_b = np.random.default_rng(42), np.random.default_rng(42)
    a = [next_token(LOGITS, params, [], [], rng_a) for _ in range(30)]
    b = [next_token(LOGITS, params, [], [], rng_b) for _ in range(30)]
    assert a == b and a[0] == first[0] and len(set(a)) > 1


def test_repetition_penalty_as_in_hf() -> None:
    out = apply_repetition_penalty(LOGITS, [1, 3, 3], 2.0)
    assert out.tolist() == [1.0, 1.5, 2.0, -2.0, 0.5]
    assert next_token(LOGITS, SamplingParams(repetition_penalty=2.0), [1], [], None) == 2


def nucleus(logits: np.ndarray, temperature: float, top_k: int, top_p: float) -> dict[int, float]:
    """The reference: the whole vocabulary sorted, top-k, softmax, then the smallest head of mass >= p."""
    order = np.argsort(-logits, kind="stable")[: top_k or None]
    probs = np.exp((logits[order] - logits[order[0]]) / temperature)
    probs /= probs.sum()
    keep = np.cumsum(probs) - probs < top_p
    return dict(zip(order[keep].tolist(), (probs[keep] / probs[keep].sum()).tolist(), strict=True))


def drawn(logits: np.ndarray, params: SamplingParams, n: int) -> dict[int, float]:
    rng = np.random.default_rng(7)
    tokens = np.array([next_token(logits, params, [], [], rng) for _ in range(n)])
    ids, counts = np.unique(tokens, return_counts=True)
    return dict(zip(ids.tolist(), (counts / n).tolist(), strict=True))


def test_top_k_and_top_p_draw_from_the_nucleus_in_proportion() -> None:
    logits = np.random.default_rng(3).normal(size=300).astype(np.float32) * 3
    for temperature, top_k, top_p in ((0.7, 0, 0.9), (1.0, 20, 0.8), (1.0, 0, 1.0)):
        want = nucleus(logits.astype(np.float64), temperature, top_k, top_p)
        got = drawn(logits, SamplingParams(temperature=temperature, top_k=top_k, top_p=top_p), 20_000)
        assert set(got) <= set(want)
        distance = sum(abs(got.get(t, 0.0) - p) for t, p in want.items()) / 2
        assert distance < 0.03, (temperature, top_k, top_p, distance)


def test_a_nucleus_wider_than_the_first_candidates_is_still_whole() -> None:
    logits = np.random.default_rng(4).normal(size=2000).astype(np.float32)  # flat: hundreds of tokens
    want = nucleus(logits.astype(np.float64), 1.0, 0, 0.95)
    assert len(want) > 256  # more than the sampler looks at before sorting everything
    got = drawn(logits, SamplingParams(temperature=1.0, top_p=0.95), 4_000)
    assert set(got) <= set(want) and len(got) > 256


@pytest.fixture
def warnings_are_errors() -> Iterator[None]:
    """Overflow and NaN show up as numpy RuntimeWarnings first: make them fail the test."""
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        yield


@pytest.mark.usefixtures("warnings_are_errors")
@pytest.mark.parametrize("temperature", [5e-324, 1e-45, 1e-38, 1e-37, 1e-20, 9.9e-6])
def test_a_tiny_temperature_is_greedy(temperature: float) -> None:
    rng = np.random.default_rng(5)
    logits = rng.normal(size=2000).astype(np.float32) * 4
    params = SamplingParams(temperature=temperature, seed=1, top_p=0.9)
    assert params.greedy
    assert next_token(logits, params, [], [], rng) == int(np.argmax(logits))


@pytest.mark.usefixtures("warnings_are_errors")
def test_the_smallest_sampling_temperature_stays_finite() -> None:
    logits = np.random.default_rng(6).normal(size=2000).astype(np.float32) * 4
    logits[7] = logits.max() + 1.0  # a clear best: it takes all the weight
    weights = np.exp(scaled(apply_repetition_penalty(logits, [7], 1e-300), GREEDY_BELOW))
    assert np.isfinite(weights).all() and weights.max() == 1.0
    rng = np.random.default_rng(6)
    params = SamplingParams(temperature=GREEDY_BELOW, repetition_penalty=1e-300)
    assert not params.greedy
    assert {next_token(logits, params, [7], [], rng) for _ in range(20)} == {7}


@pytest.mark.usefixtures("warnings_are_errors")
@pytest.mark.parametrize("penalty", [5e-324, 1e-300, 1e-30, 1e-3])
def test_a_tiny_repetition_penalty_gives_finite_probabilities(penalty: float) -> None:
    logits = np.random.default_rng(8).normal(size=2000).astype(np.float32) * 4
    seen = [int(np.argmin(np.abs(logits - 0.5))), int(np.argmin(np.abs(logits + 0.5))), 11]
    penalized = apply_repetition_penalty(logits, seen, penalty)
    assert penalized.dtype == np.float32 and np.isfinite(penalized).all()
    for temperature in (GREEDY_BELOW, 0.7, 5.0):
        weights = np.exp(scaled(penalized, temperature))
        probs = weights / weights.sum()
        assert np.isfinite(probs).all() and abs(probs.sum() - 1.0) < 1e-5
    rng = np.random.default_rng(9)
    for temperature, top_k, top_p in ((1.0, 0, 1.0), (0.5, 50, 0.9), (GREEDY_BELOW, 0, 0.5)):
        params = SamplingParams(temperature=temperature, top_k=top_k, top_p=top_p, repetition_penalty=penalty)
        token = next_token(logits, params, seen, [], rng)
        assert token == seen[0]  # the positive seen logit, divided by (nearly) 0, outranks all


def test_token_logprob_is_torchs_log_softmax_and_the_best_alternatives() -> None:
    import torch

    logits = np.random.default_rng(3).normal(0, 8, 1000).astype(np.float32)
    logits[7] = 60.0  # a near-certain token: the others' log-probabilities far below 0, still exact
    reference = torch.log_softmax(torch.from_numpy(logits).double(), dim=-1).numpy()
    logprob, alternatives = token_logprob(logits, 123, 5)
    assert logprob == pytest.approx(reference[123], abs=1e-9)
    assert [i for i, _ in alternatives] == list(np.argsort(-reference)[:5])
    assert [lp for _, lp in alternatives] == pytest.approx(sorted(reference, reverse=True)[:5], abs=1e-9)
    assert token_logprob(logits, 7, 0) == (pytest.approx(reference[7]), ())


def openai_reference(
    logits: np.ndarray, params: SamplingParams, prompt: list[int], output: list[int]
) -> list[float]:
    """Token by token in float64, as written down: bias; HF's repetition penalty over prompt and output;
    OpenAI's `logit - frequency * count - presence * (count > 0)` over the output."""
    bias = dict(params.logit_bias)
    out = []
    for token, logit in enumerate(logits.astype(np.float64).tolist()):
        logit += bias.get(token, 0.0)
        if token in prompt or token in output:
            logit = logit / params.repetition_penalty if logit > 0 else logit * params.repetition_penalty
        count = output.count(token)
        out.append(logit - params.frequency_penalty * count - params.presence_penalty * (count > 0))
    return out


@pytest.mark.parametrize(
    "shaping",
    [
        {"presence_penalty": 0.8},
        {"frequency_penalty": 0.5},
        {"frequency_penalty": -2.0, "presence_penalty": 2.0},
        {"logit_bias": ((0, 2.5), (4, -100.0), (3, 100.0))},
        {
            "repetition_penalty": 1.4,
            "presence_penalty": 0.3,
            "frequency_penalty": 0.2,
            "logit_bias": ((1, -3.0),),
        },
    ],
)
def test_shaped_scores_are_the_bias_then_the_penalties(shaping: dict[str, object]) -> None:
    logits = np.random.default_rng(11).normal(0, 3, 40).astype(np.float32)
    params = SamplingParams(**shaping)  # type: ignore[arg-type]
    prompt, output = [1, 2, 2, 30], [3, 0, 3, 3, 17, 1]
    got = shaped_scores(logits, params, prompt, output)
    assert got.dtype == np.float32 and params.shaped and not params.argmax
    np.testing.assert_allclose(got, openai_reference(logits, params, prompt, output), rtol=1e-6, atol=1e-5)
    assert (logits == np.random.default_rng(11).normal(0, 3, 40).astype(np.float32)).all()  # not in place


def test_presence_and_frequency_read_the_output_not_the_prompt() -> None:
    params = SamplingParams(presence_penalty=2.0, frequency_penalty=1.0)
    assert shaped_scores(LOGITS, params, [1, 1, 1], []).tolist() == LOGITS.tolist()
    assert next_token(LOGITS, params, [1], [], None) == 1  # the prompt's token is still the best
    assert next_token(LOGITS, params, [], [1], None) == 2  # 3 - 2 - 1 = 0 < 2 once it was said
    assert next_token(LOGITS, SamplingParams(frequency_penalty=-1.0), [], [2, 2], None) == 2  # 2 + 2 > 3


def test_plain_greedy_is_the_only_argmax_row() -> None:
    assert SamplingParams().argmax and not SamplingParams().shaped
    for shaping in ({"temperature": 0.7}, {"presence_penalty": 0.1}, {"logit_bias": ((1, 0.0),)}):
        assert not SamplingParams(**shaping).argmax  # type: ignore[arg-type]


@pytest.mark.usefixtures("warnings_are_errors")
def test_a_bias_on_an_unscored_token_leaves_it_at_probability_0() -> None:
    """A cut draft head gives -inf to the tokens it did not score: a bias or a penalty keeps them there."""
    logits = np.array([1.0, -np.inf, 2.0, -np.inf], dtype=np.float32)
    params = SamplingParams(temperature=1.0, logit_bias=((1, 100.0),), frequency_penalty=-2.0)
    scores = shaped_scores(logits, params, [], [3, 3])
    weights = np.exp(scaled(scores, 1.0))
    assert weights[1] == 0 and weights[3] == 0 and np.isfinite(scores[[0, 2]]).all()
    rng = np.random.default_rng(0)
    assert {next_token(logits, params, [], [3, 3], rng) for _ in range(50)} == {0, 2}
