"""The cascade's calibration on constructed cases whose right threshold is known by hand."""

from __future__ import annotations

import itertools

import numpy as np
import pytest

from common.cascade import (
    at_margin,
    at_threshold,
    calibrate,
    calibrate_margin,
    needed_margins,
    paying_limit,
    paying_margin,
)

# Ten inputs by confidence; the student disagrees with the teacher at 0.55, 0.62 and 0.81.
CONFIDENCE = [0.50, 0.55, 0.60, 0.62, 0.70, 0.75, 0.81, 0.90, 0.95, 0.99]
AGREES = [True, False, True, False, True, True, False, True, True, True]


@pytest.mark.parametrize(
    ("target", "threshold", "fallback", "agreement"),
    [
        (0.7, 0.0, 0.0, 0.7),  # the student alone agrees on 7 of 10
        (0.8, 0.60, 0.2, 0.8),  # 0.55's disagreement goes to the teacher with 0.50
        (0.9, 0.70, 0.4, 0.9),  # and 0.62's, with 0.60
        (1.0, 0.90, 0.7, 1.0),  # and 0.81's: everything below 0.90 to the teacher
    ],
)
def test_the_lowest_threshold_reaching_the_target_is_picked(
    target: float, threshold: float, fallback: float, agreement: float
) -> None:
    found = calibrate(CONFIDENCE, AGREES, target)
    assert found.threshold == pytest.approx(threshold)
    assert found.fallback_rate == pytest.approx(fallback)
    assert found.agreement == pytest.approx(agreement)
    assert found.student_agreement == pytest.approx(0.7)
    # and no lower candidate threshold would have reached the target
    lower = [c for c in [0.0, *CONFIDENCE] if c < threshold]
    assert all(at_threshold(CONFIDENCE, AGREES, c).agreement < target for c in lower)


def test_ties_move_together_and_a_disagreement_at_the_top_sends_everything() -> None:
    # two inputs share 0.8; one of them disagrees: both must go, the threshold cannot split a tie
    found = calibrate([0.6, 0.8, 0.8, 0.9], [True, True, False, True], 1.0)
    assert found.threshold == pytest.approx(0.9) and found.fallback_rate == pytest.approx(0.75)
    everything = calibrate([0.6, 0.9], [True, False], 1.0)
    assert everything.threshold > 0.9 and everything.fallback_rate == 1.0 and everything.agreement == 1.0


def test_agreement_never_falls_as_the_threshold_rises() -> None:
    rng = np.random.default_rng(0)
    confidence = rng.random(500)
    agrees = rng.random(500) < confidence  # surer answers agree more often, as with a real student
    steps = [at_threshold(confidence, agrees, t) for t in np.linspace(0, 1.01, 50)]
    assert all(a.agreement <= b.agreement for a, b in itertools.pairwise(steps))
    assert all(a.fallback_rate <= b.fallback_rate for a, b in itertools.pairwise(steps))
    found = calibrate(confidence, agrees, 0.95)
    assert found.agreement >= 0.95


def test_bad_calibration_inputs_are_refused() -> None:
    with pytest.raises(ValueError, match="between 0 and 1"):
        calibrate([0.5], [True], 1.5)
    with pytest.raises(ValueError, match="as many"):
        calibrate([0.5, 0.6], [True], 0.9)
    with pytest.raises(ValueError, match="at least one"):
        calibrate([], [], 0.9)


@pytest.mark.parametrize(
    ("cost", "threshold", "fallback", "agreement"),
    [
        (0.5, 0.70, 0.4, 0.9),  # below 50 % sent: 0.70 sends 4 of 10, 0.75 would send 5
        (0.65, 0.62, 0.3, 0.8),  # below 35 %: 0.62 sends 3 of 10, 0.70 would send 4
        (0.95, 0.50, 0.0, 0.7),  # below 5 %: nothing sent (0.50, the lowest confidence, sends none)
    ],
)
def test_the_paying_limit_is_the_highest_threshold_cheaper_than_the_teacher(
    cost: float, threshold: float, fallback: float, agreement: float
) -> None:
    found = paying_limit(CONFIDENCE, AGREES, cost)
    assert found is not None
    assert (found.threshold, found.fallback_rate, found.agreement) == pytest.approx(
        (threshold, fallback, agreement)
    )
    assert found.fallback_rate + cost < 1.0
    assert paying_limit(CONFIDENCE, AGREES, 1.0) is None  # a student as dear as its teacher never pays


# A ranking cascade's four queries, (student scores, teacher scores) per document; the teacher's best
# document sits 0, 0.5, 2 and 1 below the student's best with the student: the margins each query needs.
QUERIES = [
    ([3.0, 2.0, 0.0], [1.0, 0.0, 0.0]),
    ([3.0, 2.5, 0.0], [0.0, 1.0, 0.0]),
    ([1.0, 0.0, -1.0], [0.0, 0.0, 1.0]),
    ([5.0, 4.0], [0.0, 1.0]),
]  # 11 documents


def test_each_query_needs_the_gap_to_the_teachers_best_document() -> None:
    np.testing.assert_allclose(needed_margins(QUERIES), [0.0, 0.5, 2.0, 1.0])


@pytest.mark.parametrize(
    ("target", "margin", "read", "agreement"),
    [
        (0.25, 0.0, 0, 0.25),  # the student's best is the teacher's for one query in four
        (0.5, 0.5, 2, 0.5),  # query 1's two nearest documents; the others have one document within 0.5
        (0.75, 1.0, 8, 0.75),  # two documents of each query
        (1.0, 2.0, 9, 1.0),  # and query 2's third
    ],
)
def test_the_least_margin_reaching_the_target_and_the_documents_it_sends(
    target: float, margin: float, read: int, agreement: float
) -> None:
    found = calibrate_margin(QUERIES, target)
    assert found.threshold == pytest.approx(margin)
    assert found.fallback_rate == pytest.approx(read / 11)  # a lone document near the best is not sent
    assert found.agreement == pytest.approx(agreement)
    assert found.student_agreement == pytest.approx(0.25) and found.examples == 4
    assert at_margin(QUERIES, margin - 1e-9).agreement < target or margin == 0.0


def test_the_paying_margin_keeps_the_cascade_cheaper_than_the_teacher() -> None:
    paying = paying_margin(QUERIES, student_cost=0.5)  # reading 8 of 11 again would cost 0.5 + 0.73
    assert paying is not None and paying.threshold == pytest.approx(0.5) and paying.agreement == 0.5
    assert paying_margin(QUERIES, student_cost=1.0) is None


def test_bad_ranking_calibration_inputs_are_refused() -> None:
    with pytest.raises(ValueError, match="same documents"):
        needed_margins([([1.0, 2.0], [1.0])])
    with pytest.raises(ValueError, match="at least one query"):
        calibrate_margin([], 0.9)
    with pytest.raises(ValueError, match="between 0 and 1"):
        calibrate_margin(QUERIES, -0.1)


def test_a_weight_counts_as_that_many_copies_of_an_input() -> None:
    from common.cascade import calibrate

    rng = np.random.default_rng(1)
    c = rng.uniform(0, 1, 300)
    a = rng.uniform(0, 1, 300) < c
    w = rng.integers(1, 5, 300)
    weighted = calibrate(c, a, 0.95, weights=w.astype(float))
    copies = calibrate(np.repeat(c, w), np.repeat(a, w), 0.95)
    assert weighted.threshold == copies.threshold
    assert weighted.agreement == pytest.approx(copies.agreement)
    assert weighted.fallback_rate == pytest.approx(copies.fallback_rate)
    assert weighted.student_agreement == pytest.approx(copies.student_agreement)
    with pytest.raises(ValueError, match="positive weight"):
        calibrate(c, a, 0.95, weights=np.zeros(300))
