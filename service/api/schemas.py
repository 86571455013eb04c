"""The bodies of the service's own routes: model listings and errors (each task's are in its module)."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, Field


class TeacherCard(BaseModel):
    name: str
    version: int


class ModelCard(BaseModel):
    name: str
    version: int
    task: str
    variant: str
    provider: str
    frontends: int = Field(
        description="HTTP frontend processes; the model is loaded once, in the engine core."
    )
    instances: int = Field(description="Engine calls this model runs at once.")
    threads_per_instance: int = Field(description="ONNX Runtime intra-op threads of each call.")
    labels: list[str]
    max_sequence_length: int
    mask_token: str | None
    variants: list[str]
    rejected_variants: dict[str, str] = Field(
        description="Variants the export left out of this version, with why (e.g. int8 outside its "
        "parity gate): the reason `variant` is what it is."
    )
    distillation: dict[str, Any] | None
    teacher: TeacherCard | None = Field(
        None, description="A student's teacher, as served here (its manifest names it); null otherwise."
    )
    cascade: dict[str, Any] | None = Field(
        None,
        description="A student with a teacher: whether unsure inputs go to the teacher (`active`), at which "
        "`threshold`, whether the teacher answers without the student (`teacher_directly`: at the calibrated "
        "threshold the cascade costs more than the teacher alone), whether the student scored above its "
        "teacher on its distillation eval (`student_ahead`: the teacher's answers then cost quality), the "
        "export's `calibration` (a cross-encoder's `confidence` \"score-margin\": `threshold` is the ranking "
        "cascade's margin in logits), what unsure inputs get when the teacher cannot take them "
        "(`when_teacher_busy`: student or refuse) and within which `budget_ms`, and `reason` when off.",
    )
    chat: bool | None = Field(
        None,
        description="Generation models: whether /v1/chat/completions serves it (exported with a chat "
        "template; without one, /v1/completions only). Null for the other tasks.",
    )
    embedding: dict[str, Any] | None = Field(
        None,
        description="Embedding models: `dimensions`, `normalized`, `pooling` (and the graph's outputs). Null "
        "for the other tasks.",
    )
    documents_by: str | None = Field(
        None,
        description="Embedding models: the model that embeds the documents this one ranks (rerank, score, "
        "similarity, retrieval): its teacher under DISTILSERVE_EMBEDDING_DOCUMENTS=teacher, else itself. "
        "Null for the other tasks.",
    )


class OpenAIModel(BaseModel):
    """A served model as OpenAI's `GET /v1/models` lists it (its clients' `models.list()` reads `data`)."""

    id: str
    object: Literal["model"] = "model"
    created: int = Field(description="Unix time the served version was exported (0: unknown).")
    owned_by: str = "distilserve"
    chat: bool | None = Field(
        None,
        description="distilserve's own: whether /v1/chat/completions serves it (null: not a generation "
        "model). OpenAI's clients keep extra fields (`model.chat` in the python client).",
    )


class ModelList(BaseModel):
    models: list[ModelCard]
    object: Literal["list"] = "list"
    data: list[OpenAIModel] = Field(description="The same models in OpenAI's list format, one per name.")


class ErrorBody(BaseModel):
    error: str
    error_type: str


class OpenAIErrorDetail(BaseModel):
    message: str
    type: str
    param: str | None = None
    code: str | None = None


class OpenAIErrorBody(BaseModel):
    """Errors on the OpenAI-compatible routes, in OpenAI's shape (its clients read `error.message`)."""

    error: OpenAIErrorDetail


ERROR_CODES = (404, 413, 415, 422, 429, 500, 503, 504)
ERRORS: dict[int | str, dict[str, object]] = {code: {"model": ErrorBody} for code in ERROR_CODES}
# OpenAI's routes answer a bad request 400 (service.api.errors.OPENAI_STATUS), never 422; the "4XX" entry
# also keeps FastAPI from documenting its own 422 for them.
OPENAI_ERROR_CODES: tuple[int | str, ...] = (400, 404, 413, 415, 429, 500, 503, 504, "4XX")
OPENAI_ERRORS: dict[int | str, dict[str, object]] = {
    code: {"model": OpenAIErrorBody} for code in OPENAI_ERROR_CODES
}
