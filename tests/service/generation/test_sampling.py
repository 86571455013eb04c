"""Sampling rules on hand-made logits."""

from __future__ import annotations

import numpy as np

from service.generation.sampling import SamplingParams, apply_repetition_penalty, next_token

LOGITS = np.array([1.0, 3.0, 2.0, -1.0, 0.5])


def test_greedy_takes_the_argmax() -> None:
    assert next_token(LOGITS, SamplingParams(), [], None) == 1


def test_top_k_1_and_tiny_top_p_are_greedy_even_when_sampling() -> None:
    rng = np.random.default_rng(0)
    for _ in range(20):
        assert next_token(LOGITS, SamplingParams(temperature=1.5, top_k=1), [], rng) == 1
        assert next_token(LOGITS, SamplingParams(temperature=1.5, top_p=1e-6), [], rng) == 1


def test_top_k_never_leaves_the_k_best() -> None:
    rng = np.random.default_rng(1)
    drawn = {next_token(LOGITS, SamplingParams(temperature=5.0, top_k=2), [], rng) for _ in range(200)}
    assert drawn == {1, 2}


def test_seeded_sampling_repeats() -> None:
    params = SamplingParams(temperature=1.0, seed=42)
    first = [next_token(LOGITS, params, [], np.random.default_rng(42)) for _ in range(1)]
    rng_a, rng_b = np.random.default_rng(42), np.random.default_rng(42)
    a = [next_token(LOGITS, params, [], rng_a) for _ in range(30)]
    b = [next_token(LOGITS, params, [], rng_b) for _ in range(30)]
    assert a == b and a[0] == first[0] and len(set(a)) > 1


def test_repetition_penalty_as_in_hf() -> None:
    out = apply_repetition_penalty(LOGITS, [1, 3, 3], 2.0)
    assert out.tolist() == [1.0, 1.5, 2.0, -2.0, 0.5]
    assert next_token(LOGITS, SamplingParams(repetition_penalty=2.0), [1], None) == 2
