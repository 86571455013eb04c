"""The manifest's generation layout: the KV cache's own head count (grouped-query attention)."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from service.manifest import GenerationLayout


def test_a_layout_without_key_value_heads_has_as_many_as_heads() -> None:
    """Manifests written before grouped-query attention existed here keep reading the same."""
    layout = GenerationLayout.model_validate({"num_layers": 2, "num_heads": 4, "head_dim": 16})
    assert layout.num_key_value_heads == 4


def test_grouped_query_attention_records_fewer_key_value_heads() -> None:
    layout = GenerationLayout.model_validate(
        {"num_layers": 30, "num_heads": 9, "num_key_value_heads": 3, "head_dim": 64}
    )
    assert (layout.num_heads, layout.num_key_value_heads) == (9, 3)
    assert GenerationLayout.model_validate(layout.model_dump()) == layout


def test_heads_that_do_not_share_key_value_heads_evenly_are_refused() -> None:
    with pytest.raises(ValidationError, match="not a multiple"):
        GenerationLayout.model_validate(
            {"num_layers": 2, "num_heads": 4, "num_key_value_heads": 3, "head_dim": 8}
        )


def test_a_cascade_costs_more_than_its_teacher_when_student_cost_and_fallbacks_reach_one() -> None:
    from service.manifest import CascadeCalibration

    def calibration(fallback_rate: float, student_cost: float | None) -> CascadeCalibration:
        return CascadeCalibration(
            threshold=0.5,
            target_agreement=0.99,
            agreement=0.99,
            fallback_rate=fallback_rate,
            student_agreement=0.9,
            eval_examples=100,
            student_cost=student_cost,
        )

    assert calibration(0.6, 0.5).costs_more_than_teacher  # 0.5 + 0.6 of the teacher's time per input
    assert not calibration(0.3, 0.5).costs_more_than_teacher
    assert not calibration(0.9, None).costs_more_than_teacher  # not measured (an older export): cascade


def test_only_a_generation_student_has_a_variant_that_drafts_only() -> None:
    from service.manifest import Manifest

    variant = {"file": "model.onnx", "precision": "fp32", "size_bytes": 1, "sha256": "0" * 64}
    draft = variant | {"file": "model.draft.onnx", "precision": "int8", "drafts_only": True}
    student = {
        "name": "lm",
        "version": 1,
        "task": "text-generation",
        "max_sequence_length": 64,
        "inputs": [{"name": "input_ids", "dtype": "int64", "shape": ["batch", "sequence"]}],
        "outputs": [{"name": "logits", "dtype": "float32", "shape": ["batch", "sequence", 50]}],
        "variants": {"fp32": variant, "draft": draft},
        "tokenizer": {"sha256": "0" * 64, "max_length": 64, "pad_token_id": 0},
        "generation": {"num_layers": 2, "num_heads": 4, "head_dim": 16},
        "teacher": {"name": "lm-teacher", "version": 1},
    }
    assert Manifest.model_validate(student).variants["draft"].drafts_only
    with pytest.raises(ValidationError, match="drafts only"):
        Manifest.model_validate(student | {"teacher": None})  # no teacher to draft for
    with pytest.raises(ValidationError, match="drafts only"):
        Manifest.model_validate(student | {"variants": {"fp32": variant | {"drafts_only": True}}})


@pytest.mark.parametrize(
    ("metric", "student", "teacher", "ahead"),
    [
        ("accuracy", 0.9119, 0.9002, True),  # the SQuAD ranker taught longer than its teacher was trained
        ("accuracy", 0.88, 0.90, False),
        ("f1", 0.61, 0.68, False),
        ("perplexity", 21.0, 24.0, True),  # lower is better
        ("eval_loss", 2.0, 1.5, False),
        ("accuracy", None, 0.9, False),  # a score missing: nothing to say
    ],
)
def test_a_student_is_ahead_of_its_teacher_by_the_metrics_direction(
    metric: str, student: float | None, teacher: float | None, ahead: bool
) -> None:
    from service.manifest import DistillationRecord, ModelScore

    record = DistillationRecord(
        metric=metric,
        teacher=ModelScore(source="teacher", params=2, score=teacher),
        student=ModelScore(source="student", params=1, score=student),
    )
    assert record.student_ahead is ahead
