"""The parity gate's agreement: what counts as the same answer."""

from __future__ import annotations

import numpy as np

from export.parity import ParityBounds, compare


def test_a_span_agrees_only_when_both_its_ends_do() -> None:
    mask = np.array([[1, 1, 1, 1], [1, 1, 1, 0], [1, 1, 0, 0]])
    start = np.array([[0.0, 5, 1, 0], [0, 1, 5, 0], [5, 0, 0, 0]])
    end = np.array([[0.0, 1, 5, 0], [0, 1, 2, 0], [0, 5, 0, 0]])
    moved_end = end.copy()
    moved_end[1] = [0, 3, 2, 9]  # row 1: the start agrees, the end moves (9 sits on padding: ignored)
    report = compare(
        [{"start_logits": start, "end_logits": end}],
        [{"start_logits": start + 0.01, "end_logits": moved_end}],
        [{"attention_mask": mask}],
        ["start_logits", "end_logits"],
        per_position=True,
    )
    assert report.rows == 3 and report.top1_agreement == 2 / 3  # one answer per row, not one per logit
    assert report.max_abs_diff == 2.0  # 3 vs 1 on a real position; the 9 on padding is never compared


def test_a_single_logit_agrees_on_its_side_of_zero_not_on_a_vacuous_argmax() -> None:
    expected = np.array([[2.0], [-1.0], [0.5], [-3.0]])  # a cross-encoder's relevance logits
    got = np.array([[1.5], [0.2], [0.4], [-2.0]])  # row 1 crosses zero: relevant where it was not
    report = compare(
        [{"logits": expected}],
        [{"logits": got}],
        [{"attention_mask": np.ones((4, 3))}],
        ["logits"],
        per_position=False,
    )
    assert report.top1_agreement == 3 / 4 and report.single_logit

    def moved(by: float) -> list[str]:
        close = compare(
            [{"logits": expected}],
            [{"logits": expected + by}],
            [{"attention_mask": np.ones((4, 3))}],
            ["logits"],
            per_position=False,
            agreement_batches=1,
        )
        return ParityBounds(max_abs_diff=None, min_top1_agreement=0.99).failures(close)

    assert moved(0.01) == []  # 0.3 % of the scale (3): the same ranking
    assert "rankings would change" in moved(0.3)[0]  # 10 %: refused, though every sign still agrees


def test_an_fp32_bound_scales_with_the_largest_output_on_real_positions() -> None:
    """float32 rounding grows with the numbers summed: 1e-4 of a logit scale of 40 is 4e-3 (SmolLM2's
    logits reach 39), while outputs within +-1 keep the absolute 1e-4; padding sets no scale."""
    mask = np.array([[1, 1, 0]])
    logits = np.zeros((1, 3, 4))
    logits[0, 0, 1], logits[0, 2, 0] = 40.0, 1000.0  # the 1000 sits on padding
    bounds = ParityBounds(max_abs_diff=1e-4, min_top1_agreement=0.99)

    def judged(noise: float, scale: float = 1.0) -> list[str]:
        report = compare(
            [{"logits": logits * scale}],
            [{"logits": logits * scale + noise}],
            [{"attention_mask": mask}],
            ["logits"],
            per_position=True,
        )
        return bounds.failures(report, require_eval_data=False)

    assert judged(3e-3) == []
    assert "max |diff| 5.00e-03 > 4.0e-03" in judged(5e-3)[0]
    assert judged(9e-5, scale=0.01) == [] and judged(2e-4, scale=0.01) != []
