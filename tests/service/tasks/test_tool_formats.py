"""The tool-call formats of tool_choice "auto": answers read into calls and the text around them as vLLM's
parsers read them, calls written back and read again, a streamed answer's content equal to the whole
answer's however its tokens fall, and the conversation a template that cannot render tools is given."""

from __future__ import annotations

import json
from typing import Any

import pytest

from service.generation.sequence import TokenEvent
from service.manifest import ChatTemplateSpec
from service.tasks.chat_template import ChatTemplate
from service.tasks.openai_generation import Choice, _tool_chunks
from service.tasks.openai_tools import ToolCalling, conversation, tool_format
from service.tasks.tool_formats import FORMATS, Hermes, Llama3Json, format_for

WEATHER = {"name": "get_weather", "arguments": {"city": "Paris", "days": 2}}
CHATML = (  # SmolLM2's own template: it renders neither tools nor calls
    "{% for message in messages %}{{'<|im_start|>' + message['role'] + '\n' + message['content'] + "
    "'<|im_end|>' + '\n'}}{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)
WITH_TOOLS = (  # a Hermes-style template that renders both
    "{% if tools %}<tools>{% for t in tools %}{{ t.function.name }} {% endfor %}</tools>\n{% endif %}"
    "{% for m in messages %}{{ m.role }}: {{ m.content }}"
    "{% for c in m.tool_calls or [] %}<tool_call>{{ c.function.name }}</tool_call>{% endfor %}\n{% endfor %}"
    "assistant: "
)


@pytest.mark.parametrize(
    ("text", "content", "calls"),
    [
        (
            '<tool_call>{"name": "get_weather", "arguments": {"city": "Paris", "days": 2}}</tool_call>',
            None,
            1,
        ),
        (
            '<tool_call>[{"name": "a", "arguments": {}}, {"name": "b", "arguments": {"x": 1}}]</tool_call>',
            None,
            2,
        ),
        (
            '<tool_call>{"name": "a", "arguments": {}}</tool_call>\n<tool_call>{"name": "b"}</tool_call>',
            None,
            2,
        ),
        (
            'Let me look.\n<tool_call>{"name": "a", "arguments": "{\\"x\\": 1}"}</tool_call>',
            "Let me look.",
            1,
        ),
        ('<tool_call>{"name": "a", "arguments": {}}</tool_call> Done.', " Done.", 1),
        ('<tool_call>{"name": "a", "parameters": {"x": 1}}', None, 1),  # ended at EOS before the tag closed
        ("<tool_call>[]</tool_call>", "<tool_call>[]</tool_call>", 0),  # "no function helps": text
        (
            '<tool_call>{"name": "a", "arguments": {"x"</tool_call>',
            '<tool_call>{"name": "a", "arguments": {"x"',
            0,
        ),
        ('<tool_call>{"arguments": {}}</tool_call>', '<tool_call>{"arguments": {}}</tool_call>', 0),
        ("It is sunny.", "It is sunny.", 0),
    ],
)
def test_hermes_reads_calls_and_the_text_around_them(text: str, content: str | None, calls: int) -> None:
    parsed = Hermes().parse(text)
    if not calls:  # the answer stays text, whole
        content = text
    assert parsed.content == content and len(parsed.calls) == calls
    assert all(isinstance(name, str) and isinstance(arguments, dict) for name, arguments in parsed.calls)


@pytest.mark.parametrize(
    ("text", "calls"),
    [
        ('{"name": "get_weather", "parameters": {"city": "Paris"}}', [("get_weather", {"city": "Paris"})]),
        ('<|python_tag|>{"name": "a", "parameters": {}}', [("a", {})]),
        (
            '{"name": "a", "parameters": {}}; {"name": "b", "arguments": {"x": 1}}',
            [("a", {}), ("b", {"x": 1})],
        ),
        ('{"name": "a", "parameters": {}} and then some', []),
        ('{"city": "Paris"}', []),
        ("Sunny, 20 degrees.", []),
    ],
)
def test_llama3_json_reads_an_answer_that_is_calls(text: str, calls: list[Any]) -> None:
    parsed = Llama3Json().parse(text)
    assert parsed.calls == calls
    assert parsed.content == (None if calls else text)


@pytest.mark.parametrize("name", sorted(FORMATS))
def test_calls_written_are_read_back(name: str) -> None:
    calls = [("get_weather", {"city": "Zürich", "days": 2}), ("get_time", {})]
    assert FORMATS[name].parse(FORMATS[name].write(calls)).calls == calls  # type: ignore[index]


def test_the_format_follows_the_template() -> None:
    assert format_for(CHATML).name == "hermes" and format_for(None).name == "hermes"
    assert format_for("... {{- '<|python_tag|>' + tool_call.name }} ...").name == "llama3_json"
    assert tool_format("off", CHATML) is None and tool_format("auto", CHATML) is FORMATS["hermes"]
    assert tool_format("llama3_json", CHATML) is FORMATS["llama3_json"]


ANSWERS = [
    'Let me look.\n<tool_call>{"name": "get_weather", "arguments": {"city": "Paris", "days": 2}}</tool_call>',
    '<tool_call>[{"name": "get_weather", "arguments": {}}]</tool_call>\n\nThat is all.',
    "A <toolbox> is not a call, and neither is <tool_call> broken",
    "It is sunny.  ",
    "  <tool_call>",
]


def streamed(calling: ToolCalling, pieces: list[str]) -> tuple[str, list[Any], str | None]:
    """The content deltas, calls and finish reason a client is sent for an answer in these pieces."""
    choice = Choice(prepared=None)  # type: ignore[arg-type]
    chunks = []
    for i, piece in enumerate(pieces):
        last = i == len(pieces) - 1
        chunks += _tool_chunks(calling, choice, TokenEvent(i, piece, "eos" if last else None, i))
    content = "".join(c["delta"].get("content", "") for c in chunks)
    calls = [t["function"] for c in chunks for t in c["delta"].get("tool_calls", [])]
    return content, calls, chunks[-1]["finish_reason"]


@pytest.mark.parametrize("answer", ANSWERS)
@pytest.mark.parametrize("size", [1, 2, 3, 7, 1000])
def test_streamed_content_and_calls_equal_the_whole_answer(answer: str, size: int) -> None:
    from service.tasks.openai_generation import tool_shape

    calling = ToolCalling(None, names=frozenset({"get_weather"}), format=Hermes())
    whole = tool_shape(calling).choice(answer, "stop", None)
    content, calls, finish = streamed(calling, [answer[i : i + size] for i in range(0, len(answer), size)])
    assert content == (whole["message"]["content"] or "")
    assert calls == [c["function"] for c in whole["message"].get("tool_calls", [])]
    assert finish == whole["finish_reason"]


def test_a_call_is_never_streamed_as_text() -> None:
    calling = ToolCalling(None, names=frozenset({"get_weather"}), format=Hermes())
    content, calls, finish = streamed(calling, list(ANSWERS[0]))
    assert "<" not in content and content == "Let me look." and finish == "tool_calls"
    assert [json.loads(c["arguments"]) for c in calls] == [{"city": "Paris", "days": 2}]


def test_a_call_of_a_tool_not_offered_is_text() -> None:
    calling = ToolCalling(None, names=frozenset({"get_time"}), format=Hermes())
    assert calling.read(ANSWERS[0]).calls == [] and calling.read(ANSWERS[0]).content == ANSWERS[0]


def test_a_template_that_renders_no_tools_is_told_of_them() -> None:
    chatml, hermes = ChatTemplate(ChatTemplateSpec(template=CHATML)), Hermes()
    assert not chatml.renders_tools and not chatml.renders_tool_calls
    tools = [{"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object"}}}]
    auto = ToolCalling(None, names=frozenset({"get_weather"}), format=hermes)
    call = {
        "id": "c",
        "type": "function",
        "function": {"name": "get_weather", "arguments": '{"city": "Rome"}'},
    }
    messages: list[dict[str, Any]] = [
        {"role": "user", "content": "Weather in Rome?"},
        {"role": "assistant", "content": "", "tool_calls": [call]},
        {"role": "tool", "content": '{"sky": "clear"}', "tool_call_id": "c"},
    ]
    given = conversation(messages, tools, auto, chatml, hermes)
    assert given[0]["role"] == "system" and '"name": "get_weather"' in given[0]["content"]
    assert "<tool_call>" in given[0]["content"]  # how to call, in the format the answer is read in
    assert hermes.parse(given[2]["content"]).calls == [("get_weather", {"city": "Rome"})]
    assert given[3] == {"role": "user", "content": '<tool_response>\n{"sky": "clear"}\n</tool_response>'}
    own_system = conversation(
        [{"role": "system", "content": "Be brief."}, *messages], tools, auto, chatml, hermes
    )
    assert own_system[0]["content"].startswith("Be brief.\n\n") and len(own_system) == 4
    assert conversation(messages[:1], tools, None, chatml, hermes) == messages[:1]  # a text answer: no offer
    required = ToolCalling("<a grammar>", names=frozenset({"get_weather"}))  # the grammar writes the call
    for written in (hermes, None):  # DISTILSERVE_TOOL_CALL_PARSER off: the list is still offered
        (offer, user) = conversation(messages[:1], tools, required, chatml, written)
        assert offer["role"] == "system" and '"name": "get_weather"' in offer["content"]
        assert "<tool_call>" not in offer["content"] and user == messages[0]


def test_a_template_that_renders_tools_is_given_the_conversation_as_it_is() -> None:
    template = ChatTemplate(ChatTemplateSpec(template=WITH_TOOLS))
    assert template.renders_tools and template.renders_tool_calls
    messages = [{"role": "user", "content": "Hi"}]
    tools = [{"type": "function", "function": {"name": "f"}}]
    auto = ToolCalling(None, names=frozenset({"f"}), format=Hermes())
    assert conversation(messages, tools, auto, template, Hermes()) == messages
