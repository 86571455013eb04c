"""The parity gate's agreement: what counts as the same answer."""

from __future__ import annotations

import numpy as np

from export.parity import compare


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
