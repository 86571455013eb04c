"""OpenAI's generation requests: `/v1/completions` and `/v1/chat/completions` bodies, validated as strictly
as OpenAI validates them (service.tasks.openai_generation answers them)."""

from __future__ import annotations

import dataclasses
from typing import Annotated, Any, Literal

from pydantic import (
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    ValidationInfo,
    field_validator,
    model_validator,
)

from service.generation.grammar import CONSTRAINTS, constraint_grammar, json_grammar
from service.generation.sampling import SamplingParams
from service.tasks.generation_base import SamplingFields
from service.tasks.openai_tools import ToolCalling, ToolSpec, tool_calling

MAX_PROMPTS = 64  # prompts one completions request may carry (each one a choice, all decoded together)
MAX_N = 16  # answers per prompt (OpenAI's `n`)
MAX_CHOICES = 64  # prompts x n in one request
MAX_LOGIT_BIAS = 1024  # token ids one logit_bias may name


def _logit_bias(value: Any) -> tuple[tuple[int, float], ...]:
    """OpenAI's `{"token id": bias}` as (id, bias) pairs: ids written as plain decimal integers (so no id
    appears twice), biases JSON numbers in [-100, 100]. The error formatter names the field."""
    if value is None:
        return ()
    if not isinstance(value, dict):
        raise ValueError('expected an object mapping token ids to biases, e.g. {"50256": -100}')
    if len(value) > MAX_LOGIT_BIAS:
        raise ValueError(f"at most {MAX_LOGIT_BIAS} token ids")
    pairs = []
    for key, bias in value.items():
        if not (isinstance(key, str) and key.isdigit() and key == str(int(key))):
            raise ValueError(f"{key!r} is not a token id (a non-negative integer written plainly)")
        if isinstance(bias, bool) or not isinstance(bias, int | float) or not -100 <= bias <= 100:
            raise ValueError(f"the bias of token {key} must be a number in [-100, 100], not {bias!r}")
        pairs.append((int(key), float(bias)))
    return tuple(pairs)


LogitBias = Annotated[tuple[tuple[int, float], ...], BeforeValidator(_logit_bias)]


def response_grammar(value: Any) -> str | None:
    """OpenAI's response_format as llguidance's grammar text (None: free text); ValueError saying what is
    wrong with one that is not a format or whose schema cannot be compiled (~0.2 ms for a small schema)."""
    if value is None:
        return None
    if not isinstance(value, dict) or not isinstance(value.get("type"), str):
        raise ValueError('expected {"type": "text" | "json_object" | "json_schema", ...}')
    kind = value["type"]
    if kind == "text":
        return None
    if kind == "json_object":
        return json_grammar(None)
    if kind != "json_schema":
        raise ValueError(f"type {kind!r} is not one of text, json_object, json_schema")
    spec = value.get("json_schema")
    if not isinstance(spec, dict) or not isinstance(spec.get("name"), str):
        raise ValueError('json_schema needs {"name": "...", "schema": {...}}')
    schema = spec.get("schema")
    if schema is not None and not isinstance(schema, dict):
        raise ValueError("json_schema.schema must be a JSON schema (an object)")
    return json_grammar(schema)


def _response_format(value: Any) -> Any:
    """Refused before anything is queued where it cannot be followed; kept as it is (its grammar is made
    again where the sampling parameters are)."""
    response_grammar(value)
    return value


ResponseFormat = Annotated[dict[str, Any] | None, BeforeValidator(_response_format)]


def structured_grammars(value: Any) -> list[tuple[str, str]]:
    """vLLM's structured_outputs (`{"json" | "regex" | "choice" | "grammar": ...}`) as (key, grammar text)
    pairs: the keys given, each compiled."""
    if value is None:
        return []
    if not isinstance(value, dict):
        raise ValueError(
            f'expected an object with one of {", ".join(CONSTRAINTS)}, e.g. {{"choice": ["yes", "no"]}}'
        )
    return [(key, constraint_grammar(key, v)) for key, v in value.items() if v is not None]


def _structured_outputs(value: Any) -> Any:
    structured_grammars(value)
    return value


StructuredOutputs = Annotated[dict[str, Any] | None, BeforeValidator(_structured_outputs)]


def _guided(kind: str) -> Any:
    """vLLM's older `guided_<kind>` fields: the constraint, checked as structured_outputs' `kind`."""

    def check(value: Any) -> Any:
        if value is not None:
            constraint_grammar(kind, value)
        return value

    return BeforeValidator(check)


class OpenAIRequest(SamplingFields):
    """What OpenAI's completions and chat completions requests share (the fields this server implements).

    Strict as OpenAI's API is: booleans must be JSON booleans, numbers JSON numbers ("0.5" or true as a
    temperature or a seed is an error, not a value). Unknown fields are ignored (`user`, `metadata`, ...);
    OpenAI's knobs this server does not implement are refused when set, never silently ignored.
    """

    model_config = ConfigDict(extra="ignore", strict=True)

    model: str | None = None
    temperature: float = Field(1.0, ge=0.0, le=5.0)
    n: int = Field(
        1,
        ge=1,
        le=MAX_N,
        description="Answers per prompt (choice i * n + j: prompt i's j-th); with a seed, the j-th samples "
        "with seed + j.",
    )
    stream: bool = False
    stream_options: dict[str, Any] | None = None
    logit_bias: LogitBias = Field(
        (),
        description='{"token id": bias}: the bias (-100 to 100) added to that token\'s logit before '
        "sampling; -100 bans it, 100 all but forces it.",
    )

    response_format: ResponseFormat = Field(
        None,
        description='{"type": "text"} (the default); {"type": "json_object"}: the answer is a JSON object; '
        '{"type": "json_schema", "json_schema": {"name": ..., "schema": {...}}}: a JSON value the schema '
        "accepts (every token constrained as it is chosen; service.generation.grammar).",
    )

    structured_outputs: StructuredOutputs = Field(
        None,
        description='vLLM\'s: one of {"json": a schema}, {"regex": "..."}, {"choice": ["...", ...]}, '
        '{"grammar": Lark or GBNF}: the answer follows it (as response_format does a schema).',
    )
    guided_json: Annotated[dict[str, Any] | str | None, _guided("json")] = Field(
        None, description="vLLM's older name of structured_outputs.json."
    )
    guided_regex: Annotated[str | None, _guided("regex")] = Field(
        None, description="vLLM's older name of structured_outputs.regex."
    )
    guided_choice: Annotated[list[str] | None, _guided("choice")] = Field(
        None, description="vLLM's older name of structured_outputs.choice."
    )
    guided_grammar: Annotated[str | None, _guided("grammar")] = Field(
        None, description="vLLM's older name of structured_outputs.grammar."
    )

    def unsupported(self) -> list[tuple[str, bool]]:
        """(field, whether it is set to something this server cannot do); subclasses add theirs."""
        return []

    def constraints(self) -> list[tuple[str, str]]:
        """(where it was asked, llguidance's grammar text) for each constraint on the answer given."""
        asked = [("response_format", response_grammar(self.response_format))]
        asked += [(f"structured_outputs.{k}", g) for k, g in structured_grammars(self.structured_outputs)]
        for kind in CONSTRAINTS:
            value = getattr(self, f"guided_{kind}")
            asked.append((f"guided_{kind}", None if value is None else constraint_grammar(kind, value)))
        return [(name, grammar) for name, grammar in asked if grammar is not None]

    @model_validator(mode="after")
    def _one_constraint(self) -> OpenAIRequest:
        names = [name for name, _ in self.constraints()]
        if len(names) > 1:
            raise ValueError(f"one constraint on the answer at most, not {', '.join(names)}")
        return self

    def sampling(self, max_new_tokens: int, logprobs: int | None = None) -> SamplingParams:
        constraints = self.constraints()
        return dataclasses.replace(
            super().sampling(max_new_tokens, logprobs),
            logit_bias=self.logit_bias,
            grammar=constraints[0][1] if constraints else None,
        )

    @model_validator(mode="after")
    def _refuse_unsupported(self) -> OpenAIRequest:
        names = [name for name, is_set in self.unsupported() if is_set]
        if names:
            raise ValueError(f"not supported by this server: {', '.join(names)}")
        return self

    @property
    def include_usage(self) -> bool:
        return bool((self.stream_options or {}).get("include_usage"))

    def samples(self, params: SamplingParams) -> list[SamplingParams]:
        """The n answers' sampling: the j-th with seed + j when a seed is given (each reproducible)."""
        if params.seed is None:
            return [params] * self.n
        return [dataclasses.replace(params, seed=(params.seed + j) % 2**63) for j in range(self.n)]


def _completion_prompt(value: Any) -> str | list[str] | list[int] | list[list[int]]:
    """A text, token ids, or a list of either (one choice each); one clear message per wrong shape before
    the union is tried (its per-branch errors are noise)."""
    if _token_ids(value):
        prompts: list[Any] = [value]
    elif isinstance(value, list) and value and all(_token_ids(p) for p in value):
        prompts = value
    else:
        prompts = value if isinstance(value, list) else [value]
        for i, text in enumerate(prompts):
            at = f" (prompt {i})" if isinstance(value, list) else ""
            if not isinstance(text, str):
                kind = type(text).__name__
                raise ValueError(
                    f"expected a string, token ids, or a list of either (one kind), got {kind}{at}"
                )
            if not text.strip():
                raise ValueError(f"the text is empty{at}")
    if not 1 <= len(prompts) <= MAX_PROMPTS:
        raise ValueError(f"give a prompt or a list of 1 to {MAX_PROMPTS}, not {len(prompts)}")
    return value


def _token_ids(value: Any) -> bool:
    """A non-empty list of ints (JSON integers, not booleans)."""
    return (
        isinstance(value, list)
        and bool(value)
        and all(isinstance(t, int) and not isinstance(t, bool) for t in value)
    )


CompletionPrompt = Annotated[
    str | list[str] | list[int] | list[list[int]], BeforeValidator(_completion_prompt)
]


class CompletionRequest(OpenAIRequest):
    """OpenAI's /v1/completions request."""

    prompt: CompletionPrompt = Field(
        ...,
        description=f"A string or token ids, or a list of up to {MAX_PROMPTS} of either: one choice each "
        "(`index`: its place).",
    )
    max_tokens: int = Field(
        16, ge=0, le=4096, description="0 (with echo): the prompt scored, nothing generated."
    )
    echo: bool = Field(
        False,
        description="The prompt first in the answer's text, and with logprobs its tokens' log-probabilities "
        "first (the first token's null): how a client scores a text.",
    )
    logprobs: int | None = Field(
        None,
        ge=0,
        le=5,
        description="Each token's log-probability (under the model's own distribution, before temperature, "
        "penalty, top-k and top-p) and this many most likely alternatives'.",
    )
    best_of: int | None = Field(None, description="Not supported: null or 1.")
    suffix: str | None = Field(None, description="Not supported: must be null.")

    def unsupported(self) -> list[tuple[str, bool]]:
        mine = [
            ("best_of", self.best_of not in (None, 1)),
            ("suffix", self.suffix is not None),
        ]
        return mine + super().unsupported()

    @property
    def prompts(self) -> list[str | list[int]]:
        """Each prompt: a text or its token ids."""
        value: Any = self.prompt
        return [value] if isinstance(value, str) or _token_ids(value) else list(value)

    @model_validator(mode="after")
    def _nothing_to_answer(self) -> CompletionRequest:
        if self.max_tokens == 0 and not self.echo:
            raise ValueError("max_tokens 0 needs echo: true (the prompt, scored, is then the whole answer)")
        return self

    @model_validator(mode="after")
    def _choices_in_bounds(self) -> CompletionRequest:
        if len(self.prompts) * self.n > MAX_CHOICES:
            raise ValueError(f"{len(self.prompts)} prompts x n {self.n} is more than {MAX_CHOICES} choices")
        return self


def _message_content(value: Any) -> Any:
    """OpenAI's content parts (`[{"type": "text", "text": ...}]`) joined into the one string a chat
    template reads, as vLLM joins them for text-only models; any other part is refused by name."""
    if not isinstance(value, list):
        return value  # a string passes; anything else gets pydantic's "Input should be a valid string"
    if not value:
        raise ValueError("the list of content parts is empty")
    texts = []
    for i, part in enumerate(value):
        kind = part.get("type") if isinstance(part, dict) else type(part).__name__
        if kind != "text":
            raise ValueError(f"part {i} is {kind!r}: only text parts are supported")
        if set(part) - {"type", "text"} or not isinstance(part.get("text"), str):
            raise ValueError(f'part {i}: a text part is {{"type": "text", "text": "..."}}')
        texts.append(part["text"])
    return "\n".join(texts)


class CalledFunction(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)

    name: str
    arguments: str = Field(..., description="The arguments as the JSON text the model wrote.")


class EarlierToolCall(BaseModel):
    """An assistant's earlier tool call, as OpenAI's answer gave it."""

    model_config = ConfigDict(extra="forbid", strict=True)

    id: str | None = None
    type: Literal["function"] = "function"
    function: CalledFunction


class ChatMessage(BaseModel):
    """One message of the conversation (text only): an assistant's may carry the tool calls it made instead
    of text, and a `tool` message answers one of them; the chat template renders what it knows of them."""

    model_config = ConfigDict(extra="forbid", strict=True)

    role: Literal["system", "user", "assistant", "developer", "tool"]
    content: Annotated[str | None, BeforeValidator(_message_content)] = Field(
        None, description='A string, or a list of {"type": "text", "text": ...} parts.'
    )
    name: str | None = None
    tool_calls: list[EarlierToolCall] | None = Field(None, description="An assistant's earlier tool calls.")
    tool_call_id: str | None = Field(None, description="A tool message's: the call it answers.")

    @model_validator(mode="after")
    def _some_content(self) -> ChatMessage:
        if self.content is None and not (self.role == "assistant" and self.tool_calls):
            raise ValueError("content is required (an assistant's message may give tool_calls instead)")
        return self


class ChatCompletionRequest(OpenAIRequest):
    """OpenAI's /v1/chat/completions request."""

    messages: list[ChatMessage] = Field(..., min_length=1)
    max_tokens: int | None = Field(None, ge=1, le=4096, description="Deprecated by OpenAI for the next.")
    max_completion_tokens: int | None = Field(
        None, ge=1, le=4096, description="Most tokens to generate; default: as many as the window leaves."
    )
    logprobs: bool | None = Field(
        None,
        description="Each token's log-probability, under the model's own distribution (before temperature, "
        "penalty, top-k and top-p).",
    )
    top_logprobs: int | None = Field(
        None, ge=0, le=20, description="With logprobs: this many most likely alternatives per token."
    )
    tools: list[ToolSpec] | None = Field(
        None, description="Functions the answer may call (service.tasks.openai_tools); with tool_choice."
    )
    tool_choice: Any = Field(
        None,
        description='"auto" (the default with tools: the model decides, its answer read in its own '
        'tool-call format), "none", "required" (one call or more) or {"type": "function", "function": '
        '{"name": ...}}.',
    )
    parallel_tool_calls: bool = Field(True, description="false: one tool call at most.")
    functions: list[Any] | None = Field(None, description="Not supported: must be null (see tools).")
    function_call: Any = Field(None, description="Not supported: must be null (see tool_choice).")

    @field_validator("tool_choice")
    @classmethod
    def _tool_choice(cls, value: Any, info: ValidationInfo) -> Any:
        tool_calling(info.data.get("tools"), value)  # refused here, with what is wrong
        return value

    @property
    def calling(self) -> ToolCalling | None:
        """How the answer becomes tool calls (None: a text answer)."""
        return tool_calling(self.tools, self.tool_choice, self.parallel_tool_calls)

    def constraints(self) -> list[tuple[str, str]]:
        calling = self.calling
        grammar = calling.grammar if calling else None  # "auto" reads a free answer
        return super().constraints() + ([("tool_choice", grammar)] if grammar is not None else [])

    def unsupported(self) -> list[tuple[str, bool]]:
        mine = [
            ("functions", self.functions is not None),
            ("function_call", self.function_call is not None),
        ]
        return mine + super().unsupported()

    @model_validator(mode="after")
    def _top_logprobs_need_logprobs(self) -> ChatCompletionRequest:
        if self.top_logprobs is not None and not self.logprobs:
            raise ValueError("top_logprobs needs logprobs: true")
        return self

    @property
    def alternatives(self) -> int | None:
        """The engine's `logprobs`: alternatives per token, or None where no log-probabilities are asked."""
        return (self.top_logprobs or 0) if self.logprobs else None

    def token_limit(self, window: int) -> int:
        """max_completion_tokens, else max_tokens, else the window (prepare cuts it to the room left)."""
        if self.max_completion_tokens is not None:
            return self.max_completion_tokens
        return self.max_tokens if self.max_tokens is not None else window
