"""The cut head's contract: which ids a call scores, in which column, and the whole-vocabulary view."""

from __future__ import annotations

import numpy as np

from common.draft_head import DraftHead


def test_the_context_is_the_rows_distinct_ids_the_head_does_not_score_by_itself() -> None:
    head = DraftHead(tokens=10, vocabulary=100)
    context = head.context([[3, 42, 11, 42], [99, 5], []])
    assert context.tolist() == [11, 42, 99]
    assert head.context([]).tolist() == [] and head.context([[1, 2]]).tolist() == []


def test_columns_score_the_first_ids_then_the_context_in_the_order_fed() -> None:
    head = DraftHead(tokens=4, vocabulary=50)
    assert head.columns(np.array([30, 7])).tolist() == [0, 1, 2, 3, 30, 7]
    assert head.columns(head.every_token()).tolist() == list(range(50))  # the uncut head's order


def test_the_whole_vocabulary_view_gives_unscored_tokens_no_probability() -> None:
    head = DraftHead(tokens=2, vocabulary=6)
    columns = head.columns(np.array([4]))
    whole = head.whole(np.array([1.0, 2.0, 3.0], dtype=np.float32), columns)
    assert whole[[0, 1, 4]].tolist() == [1.0, 2.0, 3.0]
    assert np.isneginf(whole[[2, 3, 5]]).all()
    weights = np.exp(whole - whole.max())
    assert weights[[2, 3, 5]].sum() == 0.0 and int(np.argmax(whole)) == 4
