"""OpenAI's tool calling on /v1/chat/completions. Where the caller says a tool must be called (`tool_choice`
`"required"`: one call or more, of any of the `tools`; or `{"type": "function", "function": {"name": ...}}`:
that function), the answer follows a grammar (service.generation.grammar), as vLLM builds it: required, a
JSON array of `{"name": <a tool's>, "parameters": <its schema>}`; named, the function's parameters alone. So
every call names a tool the request offered and its arguments fit that tool's schema, whatever the model.

`"auto"` (OpenAI's default with tools: the model decides) generates freely and reads the answer in the
model's own tool-call format (service.tasks.tool_formats: Hermes' `<tool_call>` blocks, or Llama 3's JSON),
chosen from its chat template or by `DISTILSERVE_TOOL_CALL_PARSER`; calls of tools the request did not
offer, or not whole, stay text. `"none"` answers in text. The tools go to the chat template as `tools`; a
template that does not render them gets them in a system message, in the format the answer is read in, and
a conversation's earlier calls and their results written as the model would have seen them.

Either way the answer's `message.tool_calls` carry the calls (finish reason `tool_calls`; a named call's
`stop`, as OpenAI). Under a grammar each call's arguments stream as they are written
(service.tasks.call_stream), and a call cut at the token limit is still the call (finish `length`); "auto"'s
calls come whole once the answer is.
"""

from __future__ import annotations

import contextlib
import json
import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from service.generation.grammar import constraint_grammar
from service.tasks.call_stream import CallStream
from service.tasks.chat_template import ChatTemplate
from service.tasks.tool_formats import FORMATS, Parsed, ToolCallFormat, format_for, listing

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
    """How a request's answer becomes tool calls: the grammar it follows (None: "auto", read in `format`),
    the tool named if one is, and the names offered."""

    grammar: str | None
    named: str | None = None
    names: frozenset[str] = frozenset()
    format: ToolCallFormat | None = None  # "auto": how the serving model writes calls (set per model)
    parallel: bool = True  # OpenAI's parallel_tool_calls; false: one call at most

    @property
    def finish(self) -> str:
        return "stop" if self.named else "tool_calls"

    def read(self, text: str) -> Parsed:
        """The answer as calls and the text around them. Under a grammar, each call read as it was written
        (service.tasks.call_stream), its arguments the text the model wrote, cut short too (as vLLM and
        OpenAI give a call cut at the token limit); text where no call's head was whole. "auto": no calls
        where the text is not whole calls or names a tool not offered."""
        if self.grammar is not None:
            stream = CallStream(self.named)
            stream.feed(text)
            if stream.calls:
                return Parsed(None, stream.calls)
            with contextlib.suppress(ValueError, KeyError, TypeError):  # whole calls, keys in another order
                return Parsed(None, [(c["name"], c["parameters"]) for c in json.loads(text)])
        else:
            assert self.format is not None, "an auto tool calling is given its format before it reads"
            parsed = self.format.parse(text)
            if not all(name in self.names for name, _ in parsed.calls):
                return Parsed(text, [])
            return parsed if self.parallel else Parsed(parsed.content, parsed.calls[:1])
        return Parsed(text, [])

    def held(self, text: str) -> int:
        """How much of a streamed answer may go out as content before it is complete: under a grammar none
        (it is all one call), else what cannot be the beginning of one."""
        return 0 if self.format is None else self.format.held(text)


def call_id() -> str:
    return f"call_{uuid.uuid4().hex[:24]}"


def openai_calls(calls: Sequence[tuple[str, Any]]) -> list[dict[str, Any]]:
    """Calls in OpenAI's shape, each with an id of its own; arguments given as text are sent as written."""
    return [
        {
            "id": call_id(),
            "type": "function",
            "function": {
                "name": name,
                "arguments": arguments
                if isinstance(arguments, str)
                else json.dumps(arguments, ensure_ascii=False),
            },
        }
        for name, arguments in calls
    ]


NO_PARSER = (
    'tool_choice "auto" (the default with tools) reads the model\'s own tool-call format, and '
    'DISTILSERVE_TOOL_CALL_PARSER is off: give "required", or name a function'
)


def tool_calling(tools: list[ToolSpec] | None, choice: Any, parallel: bool = True) -> ToolCalling | None:
    """The request's tool calling (None: a text answer); ValueError saying what cannot be done. Not
    `parallel`: one call at most (a grammar of one; "auto", the first the model wrote)."""
    if choice not in (None, "none") and not tools:
        raise ValueError("tool_choice needs tools")
    if not tools or choice == "none":
        return None
    by_name = {t.function.name: t.function for t in tools}
    names = frozenset(by_name)
    if choice is None or choice == "auto":
        return ToolCalling(None, names=names, parallel=parallel)
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
        if not parallel:
            schema["maxItems"] = 1
        return ToolCalling(constraint_grammar("json", schema), names=names, parallel=parallel)
    function = choice.get("function") if isinstance(choice, dict) else None
    name = function.get("name") if isinstance(function, dict) else None
    if not isinstance(choice, dict) or choice.get("type") != "function" or not isinstance(name, str):
        raise ValueError(
            'expected "none", "auto", "required" or {"type": "function", "function": {"name": ...}}'
        )
    if name not in by_name:
        raise ValueError(f"no tool named {name!r} among the tools")
    grammar = constraint_grammar("json", by_name[name].parameters or ANY_ARGUMENTS)
    return ToolCalling(grammar, named=name, names=names)


def tool_format(setting: str, template: str | None) -> ToolCallFormat | None:
    """The format a model's tool calls are read and written in: the setting's, or (auto) its template's;
    None where the setting is off."""
    if setting == "off":
        return None
    return format_for(template) if setting == "auto" else FORMATS[setting]  # type: ignore[index]


def _arguments(call: dict[str, Any]) -> tuple[str, Any]:
    function = call.get("function") or {}
    arguments = function.get("arguments", "{}")
    with contextlib.suppress(ValueError):  # not JSON: written as given
        arguments = json.loads(arguments) if isinstance(arguments, str) else arguments
    return str(function.get("name", "")), arguments


def conversation(
    messages: list[dict[str, Any]],
    tools: list[dict[str, Any]] | None,
    calling: ToolCalling | None,
    chat: ChatTemplate,
    written: ToolCallFormat | None,
) -> list[dict[str, Any]]:
    """The messages the chat template is given. Where it does not render tools, the request's tools are
    offered in a system message (after the caller's own, if any): under "auto" with how to call them in the
    format `written`, under a grammar as a list (the grammar writes the call; SmolLM2, six questions and
    three tools, "required": the right tool for 6 against 4 without the list, docs/benchmarks.md). Where it
    does not render earlier calls, they are written into the assistant's text, and the tools' results into
    user messages, as `written` has them."""
    out = list(messages)
    if written is not None and not chat.renders_tool_calls:
        out = [
            {
                **m,
                "content": (m.get("content") or "") + written.write([_arguments(c) for c in m["tool_calls"]]),
            }
            if m.get("tool_calls")
            else {"role": "user", "content": written.result(m.get("content") or "")}
            if m["role"] == "tool"
            else m
            for m in out
        ]
    if tools and calling is not None and not chat.renders_tools:
        if calling.grammar is None:
            assert written is not None, "an auto tool calling has its format (the handler refuses it without)"
            offer = written.instructions(tools)
        else:
            offer = listing(tools)
        if out[0]["role"] == "system":
            out[0] = {**out[0], "content": f"{out[0]['content']}\n\n{offer}"}
        else:
            out.insert(0, {"role": "system", "content": offer})
    return out
