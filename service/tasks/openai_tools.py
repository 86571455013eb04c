"""OpenAI's tool calling on /v1/chat/completions, where the caller says a tool must be called: `tool_choice`
`"required"` (one call or more, of any of the `tools`) or `{"type": "function", "function": {"name": ...}}`
(that function). Either is a grammar on the answer (service.generation.grammar), as vLLM builds it: required,
a JSON array of `{"name": <a tool's>, "parameters": <its schema>}`; named, the function's parameters alone.
So every call names a tool the request offered and its arguments fit that tool's schema, whatever the model;
the answer's `message.tool_calls` carry them (finish reason `tool_calls`; a named call's `stop`, as OpenAI).

`"auto"` (the model decides whether to call) needs a parser of the model's own tool-call format (Hermes,
Llama 3, Mistral, ...), which no exported model here has: it is refused by name, as vLLM refuses it without
`--tool-call-parser`. `"none"` answers in text. The tools go to the chat template as `tools`, for templates
that render them.
"""

from __future__ import annotations

import json
import uuid
from dataclasses import dataclass
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from service.generation.grammar import constraint_grammar

ANY_ARGUMENTS: dict[str, Any] = {"type": "object"}  # a function that declares no parameters


class FunctionSpec(BaseModel):
    model_config = ConfigDict(extra="ignore", strict=True)

    name: str = Field(..., pattern=r"^[A-Za-z0-9_-]{1,64}$")
    description: str | None = None
    parameters: dict[str, Any] | None = Field(None, description="A JSON schema of the arguments.")
    strict: bool | None = None


class ToolSpec(BaseModel):
    model_config = ConfigDict(extra="ignore", strict=True)

    type: Literal["function"]
    function: FunctionSpec


@dataclass(frozen=True)
class ToolCalling:
    """How a request's answer becomes tool calls: which tool, if one is named, and the grammar it follows."""

    grammar: str
    named: str | None = None

    @property
    def finish(self) -> str:
        return "stop" if self.named else "tool_calls"

    def calls(self, text: str) -> list[dict[str, Any]] | None:
        """The answer's tool calls in OpenAI's shape; None where the text is not whole (cut at the token
        limit: it is then sent as text)."""
        try:
            value = json.loads(text)
            pairs = [(self.named, value)] if self.named else [(c["name"], c["parameters"]) for c in value]
        except (ValueError, KeyError, TypeError):  # not whole, or (a grammar cut short) not of that shape
            return None
        return [
            {
                "id": f"call_{uuid.uuid4().hex[:24]}",
                "type": "function",
                "function": {"name": name, "arguments": json.dumps(arguments)},
            }
            for name, arguments in pairs
        ]


def tool_calling(tools: list[ToolSpec] | None, choice: Any) -> ToolCalling | None:
    """The request's tool calling (None: a text answer); ValueError saying what cannot be done."""
    if not tools or choice is None or choice == "none":
        if choice not in (None, "none") and not tools:
            raise ValueError("tool_choice needs tools")
        if tools and choice is None:
            raise ValueError(
                'tool_choice "auto" (the default with tools) needs a parser of the model\'s own tool-call '
                'format, which this server does not have: give "required", or name a function'
            )
        return None
    by_name = {t.function.name: t.function for t in tools}
    if choice == "required":
        options = [
            {
                "type": "object",
                "properties": {"name": {"const": name}, "parameters": f.parameters or ANY_ARGUMENTS},
                "required": ["name", "parameters"],
                "additionalProperties": False,
            }
            for name, f in by_name.items()
        ]
        schema = {"type": "array", "minItems": 1, "items": {"anyOf": options}}
        return ToolCalling(constraint_grammar("json", schema))
    if choice == "auto":
        return tool_calling(tools, None)  # the same refusal, by name
    function = choice.get("function") if isinstance(choice, dict) else None
    name = function.get("name") if isinstance(function, dict) else None
    if not isinstance(choice, dict) or choice.get("type") != "function" or not isinstance(name, str):
        raise ValueError('expected "none", "required" or {"type": "function", "function": {"name": ...}}')
    if name not in by_name:
        raise ValueError(f"no tool named {name!r} among the tools")
    return ToolCalling(constraint_grammar("json", by_name[name].parameters or ANY_ARGUMENTS), named=name)
