"""Which served model answers: by task, optional name and optional pinned version."""

from __future__ import annotations

from types import SimpleNamespace
from typing import cast

import pytest

from service.registry import AmbiguousModelError, ModelNotFoundError, ModelRegistry, WrongTaskError
from service.served import ServedModel


def served(name: str, version: int, task: str) -> ServedModel:
    return cast(ServedModel, SimpleNamespace(name=name, manifest=SimpleNamespace(version=version, task=task)))


@pytest.fixture
def registry() -> ModelRegistry:
    return ModelRegistry(
        [
            served("sentiment", 1, "text-classification"),
            served("sentiment", 2, "text-classification"),
            served("minilm", 1, "text-classification"),
            served("qa", 1, "question-answering"),
            served("qa", 3, "question-answering"),
        ]
    )


def key(model: ServedModel) -> tuple[str, int]:
    return model.name, model.manifest.version


def test_the_highest_version_answers_unless_one_is_pinned(registry: ModelRegistry) -> None:
    assert key(registry.resolve("text-classification", "sentiment")) == ("sentiment", 2)
    assert key(registry.resolve("text-classification", "sentiment", 1)) == ("sentiment", 1)


def test_without_a_name_the_first_model_serving_the_task_answers(registry: ModelRegistry) -> None:
    assert key(registry.resolve("text-classification")) == ("minilm", 1)
    assert key(registry.resolve("question-answering")) == ("qa", 3)


def test_a_version_without_a_name_pins_the_tasks_only_model(registry: ModelRegistry) -> None:
    assert key(registry.resolve("question-answering", None, 1)) == ("qa", 1)


def test_a_version_without_a_name_is_ambiguous_when_several_models_serve_the_task(
    registry: ModelRegistry,
) -> None:
    with pytest.raises(AmbiguousModelError, match=r"version 2 of which model\? 2 serve .*minilm, sentiment"):
        registry.resolve("text-classification", None, 2)


def test_unknown_names_versions_and_tasks_say_what_is_served(registry: ModelRegistry) -> None:
    with pytest.raises(ModelNotFoundError, match=r"'nope' is not served \(served: minilm, qa, sentiment\)"):
        registry.resolve("text-classification", "nope")
    with pytest.raises(ModelNotFoundError, match=r"'qa' has no version 2 \(has \[1, 3\]\)"):
        registry.resolve("question-answering", "qa", 2)
    with pytest.raises(WrongTaskError, match="'qa' serves question-answering, not text-classification"):
        registry.resolve("text-classification", "qa")
    with pytest.raises(ModelNotFoundError, match="no model serving fill-mask"):
        registry.resolve("fill-mask")
