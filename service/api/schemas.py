"""HTTP request and response bodies (the API's own types, separate from manifests and engine data)."""

from __future__ import annotations

from typing import Annotated, Any

from pydantic import BaseModel, BeforeValidator, ConfigDict, Field


def _texts(value: Any) -> str | list[str]:
    """One clear message for every wrong shape of `inputs`, instead of pydantic's per-union-branch list."""
    if isinstance(value, str):
        if not value.strip():
            raise ValueError("the text is empty")
        return value
    if isinstance(value, list):
        if not value:
            raise ValueError("the list of texts is empty")
        for i, item in enumerate(value):
            if not isinstance(item, str):
                raise ValueError(f"item {i} is {type(item).__name__}, expected a string")
            if not item.strip():
                raise ValueError(f"item {i} is an empty text")
        return value
    raise ValueError(f"expected a string or a list of strings, got {type(value).__name__}")


Texts = Annotated[str | list[str], BeforeValidator(_texts)]


class _Request(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)

    model: str | None = Field(None, description="Model name; default: the first model serving the task.")
    version: int | None = Field(None, ge=1, description="Pin a model version; default: the highest.")


class ClassifyRequest(_Request):
    inputs: Texts = Field(
        ..., description="One text or a list of texts.", examples=["I loved this film, it was wonderful"]
    )
    top_k: int = Field(1, ge=1, le=1000, description="How many labels per input, best first.")


class LabelScore(BaseModel):
    label: str
    score: float


class ModelCard(BaseModel):
    name: str
    version: int
    task: str
    variant: str
    provider: str
    labels: list[str]
    max_sequence_length: int
    variants: list[str]
    distillation: dict[str, Any] | None


class ModelList(BaseModel):
    models: list[ModelCard]


class ErrorBody(BaseModel):
    error: str
    error_type: str
