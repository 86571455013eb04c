"""HTTP request and response bodies (the API's own types, separate from manifests and engine data)."""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, BeforeValidator, ConfigDict, Field, model_validator


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


class QAItem(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)

    question: str = Field(..., min_length=1, pattern=r"\S", description="The question.")
    context: str = Field(..., min_length=1, pattern=r"\S", description="The text that holds the answer.")


class QARequest(_Request):
    """One question (`question` + `context`) or several (`inputs`: a list of them)."""

    question: str | None = Field(None, min_length=1, pattern=r"\S", examples=["Who founded Acme?"])
    context: str | None = Field(
        None, min_length=1, pattern=r"\S", examples=["Acme was founded by Ada Smith in 1950 in Springfield."]
    )
    inputs: list[QAItem] | None = Field(None, min_length=1, description="Several question/context pairs.")
    top_k: int = Field(1, ge=1, le=20, description="How many answers per question, best first.")
    max_answer_length: int = Field(30, ge=1, le=512, description="Longest answer, in tokens.")
    handle_impossible_answer: bool = Field(False, description="Allow an empty answer when none fits.")
    doc_stride: int | None = Field(None, ge=1, description="Overlap between context windows, in tokens.")

    @model_validator(mode="after")
    def _one_form(self) -> QARequest:
        single = self.question is not None or self.context is not None
        if single and self.inputs is not None:
            raise ValueError("give either question + context, or inputs, not both")
        if not single and self.inputs is None:
            raise ValueError("give question and context (or inputs: a list of them)")
        if single and (self.question is None or self.context is None):
            raise ValueError("question and context go together: give both")
        return self

    def pairs(self) -> list[tuple[str, str]]:
        if self.inputs is not None:
            return [(i.question, i.context) for i in self.inputs]
        assert self.question is not None and self.context is not None
        return [(self.question, self.context)]


class QAAnswer(BaseModel):
    answer: str
    score: float
    start: int = Field(description="Character offset of the answer in the context.")
    end: int = Field(description="context[start:end] == answer.")


class FillMaskRequest(_Request):
    inputs: Texts = Field(
        ..., description="Text(s) with exactly one mask token each.", examples=["I loved this [MASK]."]
    )
    top_k: int = Field(5, ge=1, le=100, description="How many candidate tokens, best first.")


class FillMaskCandidate(BaseModel):
    token: int
    token_str: str
    score: float
    sequence: str


def _stops(value: Any) -> tuple[str, ...]:
    """The error formatter already names the field: the messages must not repeat "stop:"."""
    if value is None:
        return ()
    stops = [value] if isinstance(value, str) else value
    if not isinstance(stops, list) or not all(isinstance(x, str) and x for x in stops):
        raise ValueError("expected a non-empty string or a list of non-empty strings")
    if len(stops) > 8:
        raise ValueError("at most 8 stop sequences")
    return tuple(stops)


Stops = Annotated[tuple[str, ...], BeforeValidator(_stops)]


class SamplingFields(BaseModel):
    """Decoding knobs shared by /v1/generate and /v1/completions."""

    temperature: float = Field(0.0, ge=0.0, le=5.0, description="0 (or below 1e-5): greedy.")
    top_k: int = Field(0, ge=0, le=1000, description="Sample among the k most likely tokens; 0: all.")
    top_p: float = Field(1.0, gt=0.0, le=1.0, description="Nucleus sampling mass.")
    repetition_penalty: float = Field(1.0, gt=0.0, le=10.0, description="> 1 discourages repeats (HF).")
    seed: int | None = Field(None, ge=0, description="Makes sampling reproducible.")
    stop: Stops = Field((), description="Stop before any of these strings (not included in the text).")
    truncate_prompt: bool = Field(
        False, description="Keep the prompt's end when it exceeds the window (or the server's cache budget)."
    )
    ignore_eos: bool = Field(
        False,
        description="Go on past the end-of-sequence token up to the token limit (as vLLM's, for benchmarks).",
    )


class GenerateRequest(_Request, SamplingFields):
    prompt: str = Field(..., min_length=1, examples=["The film was"])
    max_new_tokens: int = Field(32, ge=1, le=4096, description="Most tokens to generate.")
    stream: bool = Field(False, description="Server-Sent Events: one event per token, then a final one.")


def _completion_prompt(value: Any) -> str | list[str]:
    """One clear message per wrong shape before the union is tried (its per-branch errors are noise);
    OpenAI also takes token ids, which this server does not."""
    if isinstance(value, list):
        if any(isinstance(x, list) or (isinstance(x, int) and not isinstance(x, bool)) for x in value):
            raise ValueError("token-id prompts are not supported; send the prompt as text")
        if len(value) != 1:
            raise ValueError("give one string (batches of prompts are not supported)")
        text = value[0]
    else:
        text = value
    if not isinstance(text, str):
        raise ValueError(f"expected a string (or a list holding one string), got {type(text).__name__}")
    if not text.strip():
        raise ValueError("the text is empty")
    return value


CompletionPrompt = Annotated[str | list[str], BeforeValidator(_completion_prompt)]


class CompletionRequest(SamplingFields):
    """OpenAI's /v1/completions request (the fields this server implements; others are ignored).

    Strict as OpenAI's API is: booleans must be JSON booleans, numbers JSON numbers ("0.5" or true as a
    temperature or a seed is an error, not a value).
    """

    model_config = ConfigDict(extra="ignore", strict=True)

    model: str | None = None
    prompt: CompletionPrompt = Field(..., description="A string (or a list holding one string).")
    max_tokens: int = Field(16, ge=1, le=4096)
    temperature: float = Field(1.0, ge=0.0, le=5.0)
    n: int = Field(1, ge=1, le=1, description="Only 1 is supported.")
    stream: bool = False
    stream_options: dict[str, Any] | None = None
    echo: bool = Field(False, description="Not supported: must be false.")
    # OpenAI's other knobs this server does not implement: refused when set, never silently ignored.
    logprobs: int | None = Field(None, description="Not supported: must be null.")
    best_of: int | None = Field(None, description="Not supported: null or 1.")
    suffix: str | None = Field(None, description="Not supported: must be null.")
    logit_bias: dict[str, float] | None = Field(None, description="Not supported: null or empty.")
    presence_penalty: float = Field(0.0, description="Not supported: must be 0 (see repetition_penalty).")
    frequency_penalty: float = Field(0.0, description="Not supported: must be 0 (see repetition_penalty).")

    @model_validator(mode="after")
    def _unsupported(self) -> CompletionRequest:
        unsupported = [
            name
            for name, is_set in (
                ("echo", self.echo),
                ("logprobs", self.logprobs is not None),
                ("best_of", self.best_of not in (None, 1)),
                ("suffix", self.suffix is not None),
                ("logit_bias", bool(self.logit_bias)),
                ("presence_penalty", self.presence_penalty != 0),
                ("frequency_penalty", self.frequency_penalty != 0),
            )
            if is_set
        ]
        if unsupported:
            raise ValueError(f"not supported by this server: {', '.join(unsupported)}")
        return self

    @property
    def text(self) -> str:
        return self.prompt if isinstance(self.prompt, str) else self.prompt[0]


class GenerateResponse(BaseModel):
    generated_text: str
    tokens: int = Field(description="Tokens generated (the eos token included when it ended the text).")
    finish_reason: str = Field(description="length | eos | stop")


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


class OpenAIModel(BaseModel):
    """A served model as OpenAI's `GET /v1/models` lists it (its clients' `models.list()` reads `data`)."""

    id: str
    object: Literal["model"] = "model"
    created: int = Field(description="Unix time the served version was exported (0: unknown).")
    owned_by: str = "distilserve"


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
OPENAI_ERRORS: dict[int | str, dict[str, object]] = {code: {"model": OpenAIErrorBody} for code in ERROR_CODES}
