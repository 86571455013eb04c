"""Shared fixtures: one tiny teacher/student pair and its exported repository per test session."""

from __future__ import annotations

from pathlib import Path

import pytest


@pytest.fixture(scope="session")
def demo_pair(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """A tiny classification teacher and its distilled student, trained in seconds on demo data."""
    from training.demo import build_demo_pair

    return build_demo_pair(tmp_path_factory.mktemp("demo"), quick=True, seed=0)


@pytest.fixture(scope="session")
def classification_repository(tmp_path_factory: pytest.TempPathFactory, demo_pair: tuple[Path, Path]) -> Path:
    """A model repository holding the student as `sentiment` v1 (every variant), exported with optimum."""
    from export.pipeline import export_model
    from export.variants import ALL_VARIANTS

    repository = tmp_path_factory.mktemp("models")
    eval_data = demo_pair[1].parent.parent / "data" / "classification" / "eval.jsonl"
    result = export_model(
        demo_pair[1], "text-classification", "sentiment", repository, ALL_VARIANTS, eval_data=eval_data
    )
    assert result.version_dir is not None, [r.problems for r in result.variants]
    return repository
