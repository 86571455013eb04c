"""The speculative sampling rule on hand-made distributions: what it emits follows the teacher's p, and a
row's distribution is what the sampler draws from."""

from __future__ import annotations

import numpy as np

from service.generation.acceptance import accept, allowed_ahead, distribution
from service.generation.sampling import SamplingParams
from service.generation.sequence import Sequence


def chi_square(counts: np.ndarray, probabilities: np.ndarray) -> float:
    expected = counts.sum() * probabilities
    keep = expected > 0
    assert counts[~keep].sum() == 0  # nothing where the teacher puts no mass
    return float(((counts[keep] - expected[keep]) ** 2 / expected[keep]).sum())


def test_the_sampling_rule_keeps_the_teachers_distribution() -> None:
    """Drafts drawn from q, kept or replaced by the rule: the emitted tokens follow p, the teacher's, at
    the first position and (given two emitted) at the second; a chi-square test on a 6-token vocabulary."""
    rng = np.random.default_rng(0)
    vocab, trials = 6, 40_000
    p = [rng.dirichlet(np.ones(vocab)) for _ in range(3)]
    q = [rng.dirichlet(np.ones(vocab)) for _ in range(2)]
    q[1][3] = 0.0  # the draft never proposes a token the teacher may want: the residual must supply it
    q[1] /= q[1].sum()
    first, second = np.zeros(vocab), np.zeros(vocab)
    for _ in range(trials):
        drafts = [int(rng.choice(vocab, p=q[0])), int(rng.choice(vocab, p=q[1]))]
        emitted = accept(drafts, q, p, rng)
        first[emitted[0]] += 1
        if len(emitted) >= 2:
            second[emitted[1]] += 1
    critical = 20.52  # chi-square, 5 degrees of freedom, p = 0.001
    assert chi_square(first, p[0]) < critical
    assert chi_square(second, p[1]) < critical
    # and the rule is not vacuous: a draft that differs from the teacher is sometimes refused
    assert second.sum() < trials


def test_distribution_is_what_the_sampler_draws_from() -> None:
    logits = np.array([2.0, 1.0, 0.5, -1.0, 3.0], dtype=np.float32)
    greedy = distribution(logits, SamplingParams(), [], [])
    assert greedy.tolist() == [0, 0, 0, 0, 1]
    top2 = distribution(logits, SamplingParams(temperature=1.0, top_k=2), [], [])
    e = np.exp([3.0, 2.0])
    np.testing.assert_allclose(top2[[4, 0]], e / e.sum())
    assert top2[[1, 2, 3]].sum() == 0
    full = distribution(logits, SamplingParams(temperature=0.5), [], [])
    w = np.exp((logits - logits.max()) / 0.5)
    np.testing.assert_allclose(full, w / w.sum(), rtol=1e-6)


def test_min_tokens_holds_the_stop_ids_back_as_far_as_the_drafts_reach() -> None:
    seq = Sequence(prompt=[1], params=SamplingParams(min_tokens=3), stop_ids=frozenset({0, 4}))
    seq.output = [7]
    assert allowed_ahead(seq, 6, 0).tolist() == [False, True, True, True, False, True]
    assert allowed_ahead(seq, 6, 1).tolist() == [False, True, True, True, False, True]  # 2 tokens: still held
    assert allowed_ahead(seq, 6, 2).all()  # the 4th token may end it
