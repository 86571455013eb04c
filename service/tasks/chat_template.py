"""Chat messages -> the prompt text a chat model was trained on, with the model's own Jinja template.

Rendered as HF transformers' `apply_chat_template(..., add_generation_prompt=True)` renders it (its
`_compile_jinja_template`), without importing transformers: a sandboxed, immutable Jinja environment with
trim_blocks and lstrip_blocks, loop controls, `raise_exception` (a template's way to refuse a conversation),
a `tojson` that keeps non-ASCII text and HTML characters as they are, `strftime_now`, the `{% generation %}`
block (rendered as its body: it only marks assistant text for training masks), and the tokenizer's bos/eos
tokens as variables. Each model's template is compiled once, when the model is loaded (service.served).
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from datetime import datetime
from typing import Any

import jinja2
import jinja2.ext
import jinja2.nodes
from jinja2.sandbox import ImmutableSandboxedEnvironment

from service.manifest import ChatTemplateSpec


class ChatTemplateError(ValueError):
    """The template refused the messages (its raise_exception) or failed on them."""


class _GenerationBlock(jinja2.ext.Extension):
    """`{% generation %}...{% endgeneration %}`: HF marks assistant text with it for training masks; a
    server only needs its body."""

    tags = {"generation"}  # noqa: RUF012 - jinja's Extension API declares it as a class attribute

    def parse(self, parser: jinja2.parser.Parser) -> jinja2.nodes.Node:
        lineno = next(parser.stream).lineno
        body = parser.parse_statements(("name:endgeneration",), drop_needle=True)
        return jinja2.nodes.CallBlock(self.call_method("_body"), [], [], body).set_lineno(lineno)

    def _body(self, caller: Any) -> str:
        return str(caller())


def _raise_exception(message: str) -> None:
    raise jinja2.exceptions.TemplateError(message)


def _tojson(
    value: Any,
    ensure_ascii: bool = False,
    indent: int | None = None,
    separators: tuple[str, str] | None = None,
    sort_keys: bool = False,
) -> str:
    """HF's override of Jinja's `tojson`, which would escape HTML characters a prompt must keep."""
    return json.dumps(
        value, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys
    )


def _strftime_now(format: str) -> str:
    return datetime.now().strftime(format)


def _environment() -> ImmutableSandboxedEnvironment:
    env = ImmutableSandboxedEnvironment(
        trim_blocks=True, lstrip_blocks=True, extensions=[_GenerationBlock, jinja2.ext.loopcontrols]
    )
    env.filters["tojson"] = _tojson
    env.globals["raise_exception"] = _raise_exception
    env.globals["strftime_now"] = _strftime_now
    return env


PROBE = "distilserve_probe_function"
PROBE_USER = {"role": "user", "content": "Hello"}
PROBE_TOOL = {"type": "function", "function": {"name": PROBE, "parameters": {"type": "object"}}}
PROBE_CALLED = {
    "role": "assistant",
    "content": "",
    "tool_calls": [{"id": "call_0", "type": "function", "function": {"name": PROBE, "arguments": "{}"}}],
}


class ChatTemplate:
    """One model's compiled template; `render` is safe to call from any request (the template is
    immutable and sandboxed: it can neither change the messages nor reach Python internals)."""

    def __init__(self, spec: ChatTemplateSpec) -> None:
        self._template = _environment().from_string(spec.template)  # jinja2.TemplateSyntaxError if bad
        self._tokens = {"bos_token": spec.bos_token, "eos_token": spec.eos_token}
        self.renders_tools = self._shows(PROBE, [PROBE_USER], [PROBE_TOOL])
        self.renders_tool_calls = self._shows(PROBE, [PROBE_USER, PROBE_CALLED, PROBE_USER])

    def _shows(
        self, name: str, messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None = None
    ) -> bool:
        """Whether the template writes `name` (a probe tool's) into the prompt: whether it renders tools,
        or earlier calls (service.tasks.openai_tools writes them for templates that do not)."""
        try:
            return name in self.render(messages, tools)
        except ChatTemplateError:
            return False

    def render(self, messages: Sequence[dict[str, Any]], tools: list[dict[str, Any]] | None = None) -> str:
        """The prompt, ending with the template's opening of the assistant's turn; `tools` (OpenAI's) for
        templates that render them."""
        try:
            return self._template.render(
                messages=list(messages),
                add_generation_prompt=True,
                tools=tools,
                documents=None,
                **self._tokens,
            )
        except jinja2.exceptions.TemplateError as e:  # raise_exception, an undefined name, the sandbox
            raise ChatTemplateError(str(e) or type(e).__name__) from None
        except (TypeError, ValueError, KeyError, IndexError, AttributeError) as e:
            raise ChatTemplateError(f"{type(e).__name__}: {e}") from None


def compile_chat_template(spec: ChatTemplateSpec | None) -> tuple[ChatTemplate | None, str | None]:
    """The compiled template, or why there is none (no template, or one Jinja cannot compile: that model
    then answers chat requests with the reason and still serves completions)."""
    if spec is None:
        return None, "it has no chat template (exported from a tokenizer without one)"
    try:
        return ChatTemplate(spec), None
    except jinja2.exceptions.TemplateError as e:
        return None, f"its chat template does not compile: {e}"
