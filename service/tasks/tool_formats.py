"""The text formats in which chat models write tool calls, read back into OpenAI's `tool_calls` for
`tool_choice` `"auto"` (the model decides whether to call), as vLLM's `--tool-call-parser` reads them.

- `hermes`: `<tool_call>{"name": ..., "arguments": {...}}</tool_call>`, one block per call or a JSON list in
  one block (Hermes, Qwen 2.5 and 3, SmolLM2 and 3), text around the blocks being the message's content.
- `llama3_json`: the whole answer is `{"name": ..., "parameters": {...}}` (`;` between several calls),
  optionally after `<|python_tag|>` (Llama 3.1 to 3.3's JSON tool calling).

A format also says how to tell a model about the tools where its chat template does not render them, how
to write a model's earlier calls back into a conversation, and how much of a streamed answer must wait
because it may be the beginning of a call.
"""

from __future__ import annotations

import json
import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Literal, Protocol

FormatName = Literal["hermes", "llama3_json"]


@dataclass(frozen=True)
class Parsed:
    """An answer read as calls: `(name, arguments)` each, and the text outside them (None where there is
    none). No calls: the answer is text, whole."""

    content: str | None
    calls: Sequence[tuple[str, dict[str, Any] | str]]  # arguments: an object, or a named call's text


class ToolCallFormat(Protocol):
    name: FormatName

    def instructions(self, tools: list[dict[str, Any]]) -> str:
        """A system message that offers the tools (OpenAI's `tools` entries) and says how to call them."""
        ...

    def write(self, calls: list[tuple[str, dict[str, Any]]]) -> str:
        """Earlier calls as the model would have written them."""
        ...

    def result(self, content: str) -> str:
        """A tool's result as the user message that carries it back to the model."""
        ...

    def parse(self, text: str) -> Parsed: ...

    def held(self, text: str) -> int:
        """How much of a streamed answer so far may be sent as content: the rest may begin a call."""
        ...


def _call(value: Any) -> tuple[str, dict[str, Any]] | None:
    """One call's name and arguments (an object, or a string holding one), as models write them."""
    if not isinstance(value, dict) or not isinstance(value.get("name"), str):
        return None
    arguments = value.get("arguments", value.get("parameters", {}))
    if isinstance(arguments, str):
        try:
            arguments = json.loads(arguments)
        except ValueError:
            return None
    return (value["name"], arguments) if isinstance(arguments, dict) else None


def _calls(value: Any) -> list[tuple[str, dict[str, Any]]] | None:
    """A call, or a list of them; None where any is not one."""
    found = [_call(v) for v in (value if isinstance(value, list) else [value])]
    return None if any(c is None for c in found) else [c for c in found if c is not None]


def _tool_lines(tools: list[dict[str, Any]]) -> str:
    return "\n".join(json.dumps(t.get("function", t), ensure_ascii=False) for t in tools)


OFFER = "You may call functions to answer. The functions, one JSON signature a line:\n"


def _offer(listed: str, how: str) -> str:
    """A system message offering the tools, as `listed`, and saying `how` to call them."""
    return f"{OFFER}{listed}\n{how} If no function helps, answer in words."


def listing(tools: list[dict[str, Any]]) -> str:
    """A system message offering the tools where a grammar writes the call (no format to explain)."""
    return OFFER + _tool_lines(tools)


def _partial_suffix(text: str, marker: str) -> int:
    """Where a suffix of `text` that begins `marker` starts (len(text): none does)."""
    for start in range(max(0, len(text) - len(marker) + 1), len(text)):
        if marker.startswith(text[start:]):
            return start
    return len(text)


class Hermes:
    name: FormatName = "hermes"
    OPEN, CLOSE = "<tool_call>", "</tool_call>"
    _BLOCK = re.compile(r"<tool_call>(.*?)(?:</tool_call>|$)", re.DOTALL)

    def instructions(self, tools: list[dict[str, Any]]) -> str:
        how = (
            "To call functions, answer only with <tool_call>"
            '[{"name": <function name>, "arguments": <an object of its arguments>}, ...]</tool_call>.'
        )
        return _offer(f"<tools>\n{_tool_lines(tools)}\n</tools>", how)

    def write(self, calls: list[tuple[str, dict[str, Any]]]) -> str:
        listed = [{"name": name, "arguments": arguments} for name, arguments in calls]
        return f"{self.OPEN}{json.dumps(listed, ensure_ascii=False)}{self.CLOSE}"

    def result(self, content: str) -> str:
        return f"<tool_response>\n{content}\n</tool_response>"

    def parse(self, text: str) -> Parsed:
        blocks = list(self._BLOCK.finditer(text))
        if not blocks:
            return Parsed(text, [])
        calls: list[tuple[str, dict[str, Any]]] = []
        for block in blocks:
            try:
                found = _calls(json.loads(block.group(1)))
            except ValueError:
                found = None
            if found is None:  # not whole (cut short), or not calls: the answer stays text
                return Parsed(text, [])
            calls += found
        if not calls:  # an empty list: the model says no function helps
            return Parsed(text, [])
        content = text[: blocks[0].start()].rstrip() + text[blocks[-1].end() :].rstrip()
        return Parsed(content if content.strip() else None, calls)

    def held(self, text: str) -> int:
        start = text.find(self.OPEN)
        cut = start if start >= 0 else _partial_suffix(text, self.OPEN)
        return len(text[:cut].rstrip())  # whitespace waits too: it is not content if a call follows


class Llama3Json:
    name: FormatName = "llama3_json"
    TAG = "<|python_tag|>"

    def instructions(self, tools: list[dict[str, Any]]) -> str:
        how = (
            "To call one, answer only with a JSON object "
            '{"name": <function name>, "parameters": <an object of its arguments>} '
            '(several: separated by ";").'
        )
        return _offer(_tool_lines(tools), how)

    def write(self, calls: list[tuple[str, dict[str, Any]]]) -> str:
        return "; ".join(
            json.dumps({"name": name, "parameters": arguments}, ensure_ascii=False)
            for name, arguments in calls
        )

    def result(self, content: str) -> str:
        return f"The function returned: {content}"

    def parse(self, text: str) -> Parsed:
        body = text.strip().removeprefix(self.TAG).lstrip()
        if not body.startswith("{"):
            return Parsed(text, [])
        decoder, at, calls = json.JSONDecoder(), 0, []
        while at < len(body):
            try:
                value, at = decoder.raw_decode(body, at)
            except ValueError:
                return Parsed(text, [])
            call = _call(value)
            if call is None:
                return Parsed(text, [])
            calls.append(call)
            while at < len(body) and body[at] in " \t\r\n;":
                at += 1
        return Parsed(None, calls)

    def held(self, text: str) -> int:
        start = text.lstrip()
        may_call = start.startswith(("{", self.TAG)) or self.TAG.startswith(start)
        return 0 if may_call else len(text)


FORMATS: dict[FormatName, ToolCallFormat] = {"hermes": Hermes(), "llama3_json": Llama3Json()}


def format_for(template: str | None) -> ToolCallFormat:
    """The format a chat template's model writes: Llama 3's where the template speaks of its python tag
    (its tool-calling prompt), else Hermes', the most common."""
    return FORMATS["llama3_json" if template and Llama3Json.TAG in template else "hermes"]
