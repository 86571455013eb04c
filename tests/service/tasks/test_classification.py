"""Classification's post-processing: a batch's probabilities once, then the top-k labels of a row."""

from __future__ import annotations

import numpy as np
import pytest

from service.tasks.classification import top_labels, with_probabilities


def test_probabilities_are_a_softmax_per_row_beside_the_logits() -> None:
    logits = np.array([[1000.0, 999.0, 0.0], [-3.0, -3.0, -3.0]], dtype=np.float32)  # no overflow
    outputs = with_probabilities({"logits": logits})
    assert outputs["logits"] is logits
    probabilities = outputs["probabilities"]
    assert probabilities.dtype == np.float64
    expected = np.exp(logits.astype(np.float64) - logits.max(axis=1, keepdims=True))
    np.testing.assert_allclose(probabilities, expected / expected.sum(axis=1, keepdims=True), rtol=1e-12)
    np.testing.assert_allclose(probabilities.sum(axis=1), 1.0)


def test_top_labels_are_best_first_and_ties_keep_the_label_order() -> None:
    labels = {0: "negative", 1: "neutral", 2: "positive"}
    row = np.array([0.25, 0.5, 0.25])
    assert top_labels(row, labels, 3, "m") == [
        {"label": "neutral", "score": 0.5, "model": "m"},
        {"label": "negative", "score": 0.25, "model": "m"},
        {"label": "positive", "score": 0.25, "model": "m"},
    ]


@pytest.mark.parametrize(("top_k", "count"), [(0, 1), (1, 1), (2, 2), (50, 2)])
def test_top_k_is_clamped_to_the_labels_and_an_unnamed_label_gets_a_name(top_k: int, count: int) -> None:
    result = top_labels(np.array([0.1, 0.9]), {0: "no"}, top_k, "m")
    assert len(result) == count
    assert result[0] == {"label": "LABEL_1", "score": 0.9, "model": "m"}
    assert all(isinstance(r["score"], float) for r in result)
