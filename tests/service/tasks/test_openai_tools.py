"""Tool calling on /v1/chat/completions through the official client: `tool_choice` "required" and a named
function give calls of the offered tools whose arguments fit their schemas, whole and streamed; "auto" reads
the calls the model writes in its own format (here made to write them by a regex), whole and streamed, and
leaves other text as text; mistakes are clear 400s; a conversation that carries earlier calls and their
results renders."""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from tests.service.live_server import LiveServer, live_server
from tests.tiny_models import build_tiny_llama

CHAT = "chat"
MESSAGES = [{"role": "user", "content": "Weather in Paris?"}]
WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "The weather in a city.",
        "parameters": {
            "type": "object",
            "properties": {
                "city": {"type": "string", "enum": ["Paris", "Rome"]},
                "days": {"enum": [1, 2, 3]},
            },
            "required": ["city", "days"],
            "additionalProperties": False,
        },
    },
}
TIME = {
    "type": "function",
    "function": {
        "name": "get_time",
        "parameters": {
            "type": "object",
            "properties": {"zone": {"enum": ["UTC", "CET"]}},
            "required": ["zone"],
            "additionalProperties": False,
        },
    },
}
ARGUMENTS = {"get_weather": ({"city", "days"}, {"Paris", "Rome"}), "get_time": ({"zone"}, {"UTC", "CET"})}


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LiveServer]:
    from export.pipeline import export_model

    root = tmp_path_factory.mktemp("tools")
    model_dir = build_tiny_llama(root / "hf", positions=1024)  # a call is ~60 byte-level tokens
    assert export_model(model_dir, "text-generation", CHAT, root / "repo", ("fp32",)).version_dir is not None
    with live_server(root / "repo") as s:
        yield s


def client(server: LiveServer) -> Any:
    from openai import OpenAI

    return OpenAI(base_url=f"{server.base_url}/v1", api_key="unused", max_retries=0)


def fits(name: str, arguments: str) -> bool:
    keys, values = ARGUMENTS[name]
    parsed = json.loads(arguments)
    return set(parsed) == keys and any(v in values for v in parsed.values())


def test_required_calls_offered_tools_with_fitting_arguments(server: LiveServer) -> None:
    for temperature, seed in ((0, None), *((1.2, s) for s in range(4))):
        answer = client(server).chat.completions.create(
            model=CHAT,
            messages=MESSAGES,
            tools=[WEATHER, TIME],
            tool_choice="required",
            max_tokens=300,
            temperature=temperature,
            seed=seed,
        )
        choice = answer.choices[0]
        assert choice.finish_reason == "tool_calls" and choice.message.content is None
        calls = choice.message.tool_calls
        assert calls and all(c.type == "function" and c.id.startswith("call_") for c in calls)
        assert all(fits(c.function.name, c.function.arguments) for c in calls)


def test_a_named_function_is_the_one_called(server: LiveServer) -> None:
    named = {"type": "function", "function": {"name": "get_time"}}
    for temperature, seed in ((0, None), (1.3, 5)):
        answer = client(server).chat.completions.create(
            model=CHAT,
            messages=MESSAGES,
            tools=[WEATHER, TIME],
            tool_choice=named,
            max_tokens=100,
            temperature=temperature,
            seed=seed,
        )
        (call,) = answer.choices[0].message.tool_calls
        assert call.function.name == "get_time" and fits("get_time", call.function.arguments)
        assert answer.choices[0].finish_reason == "stop"  # as OpenAI answers a named call


def test_streamed_calls_equal_the_whole_answers(server: LiveServer) -> None:
    asked = {
        "model": CHAT,
        "messages": MESSAGES,
        "tools": [WEATHER, TIME],
        "max_tokens": 200,
        "temperature": 0,
    }
    whole = client(server).chat.completions.create(**asked, tool_choice="required")
    chunks = list(client(server).chat.completions.create(**asked, tool_choice="required", stream=True))
    deltas = [d for c in chunks if c.choices for d in (c.choices[0].delta.tool_calls or [])]
    finish = [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason]
    calls: dict[int, list[Any]] = {}  # each call's fragments, as a client joins them
    for d in deltas:
        calls.setdefault(d.index, []).append(d)
    streamed = [(f[0].function.name, "".join(d.function.arguments for d in f)) for f in calls.values()]
    assert streamed == [(c.function.name, c.function.arguments) for c in whole.choices[0].message.tool_calls]
    assert finish == ["tool_calls"] and list(calls) == list(range(len(calls)))
    assert all(
        f[0].id and all(d.id is None and d.function.name is None for d in f[1:]) for f in calls.values()
    )
    assert len(deltas) > 2 * len(calls)  # arguments in fragments, as they were written


def test_a_named_calls_arguments_stream_as_they_are_written(server: LiveServer) -> None:
    """OpenAI's stream of a call: its id and name with the first fragment, then fragments of the arguments;
    joined, the whole answer's. Cut at the token limit, the call is still the call (finish "length")."""
    named = {"type": "function", "function": {"name": "get_weather"}}
    for max_tokens, finish in ((100, "stop"), (6, "length")):
        asked = {"model": CHAT, "messages": MESSAGES, "tools": [WEATHER], "tool_choice": named}
        asked |= {"max_tokens": max_tokens, "temperature": 0}
        whole = client(server).chat.completions.create(**asked)
        (call,) = whole.choices[0].message.tool_calls
        assert whole.choices[0].finish_reason == finish and call.function.name == "get_weather"
        chunks = list(client(server).chat.completions.create(**asked, stream=True))
        deltas = [t for c in chunks if c.choices for t in c.choices[0].delta.tool_calls or []]
        assert len(deltas) > 1 and deltas[0].id and deltas[0].function.name == "get_weather"
        assert all(d.id is None and d.function.name is None for d in deltas[1:])
        assert "".join(d.function.arguments or "" for d in deltas) == call.function.arguments
        assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == finish
        if finish == "stop":
            assert fits("get_weather", call.function.arguments)


def test_a_conversation_with_earlier_calls_and_their_results_renders(server: LiveServer) -> None:
    call = {"id": "call_1", "type": "function", "function": {"name": "get_weather", "arguments": "{}"}}
    messages = [
        *MESSAGES,
        {"role": "assistant", "tool_calls": [call]},
        {"role": "tool", "tool_call_id": "call_1", "content": '{"sky": "clear"}'},
    ]
    answer = client(server).chat.completions.create(
        model=CHAT, messages=messages, max_tokens=4, temperature=0
    )
    assert answer.choices[0].message.content is not None  # a text answer: no tool_choice


@pytest.mark.parametrize(
    ("change", "message", "param"),
    [
        ({"tools": [WEATHER], "tool_choice": "any"}, 'expected "none", "auto", "required"', "tool_choice"),
        ({"tool_choice": "required"}, "tool_choice needs tools", "tool_choice"),
        (
            {"tools": [WEATHER], "tool_choice": {"type": "function", "function": "get_weather"}},
            'expected "none", "auto", "required" or {"type": "function"',
            "tool_choice",
        ),
        (
            {"tools": [WEATHER], "tool_choice": {"type": "function", "function": {"name": "nope"}}},
            "no tool named 'nope' among the tools",
            "tool_choice",
        ),
        (
            {"tools": [WEATHER], "tool_choice": "required", "response_format": {"type": "json_object"}},
            "one constraint on the answer at most, not response_format, tool_choice",
            None,
        ),
        (
            {"tools": [{"type": "function", "function": {"name": "a b"}}], "tool_choice": "required"},
            "pattern",
            None,
        ),
        ({"messages": [{"role": "assistant"}]}, "content is required", "messages.0"),
        (
            {
                "messages": [
                    {"role": "assistant", "tool_calls": [{"function": {"name": 3, "arguments": "{}"}}]}
                ]
            },
            "Input should be a valid string",
            "messages.0.tool_calls.0.function.name",
        ),
        (
            {
                "messages": [
                    {"role": "assistant", "tool_calls": [{"function": {"name": "f", "arguments": {}}}]}
                ]
            },
            "Input should be a valid string",
            "messages.0.tool_calls.0.function.arguments",
        ),
    ],
)
def test_tool_mistakes_are_clear_400s(
    server: LiveServer, change: dict[str, Any], message: str, param: str | None
) -> None:
    body = {"model": CHAT, "messages": MESSAGES, "max_tokens": 4, **change}
    r = httpx.post(f"{server.base_url}/v1/chat/completions", json=body, timeout=30)
    assert r.status_code == 400, r.text
    error = r.json()["error"]
    assert message in error["message"], error
    if param is not None:
        assert error["param"] == param


def test_text_that_is_not_whole_calls_stays_text() -> None:
    from service.tasks.openai_tools import ToolCalling

    required = ToolCalling(grammar="")  # each call as written: cut short, the calls whose heads are whole
    assert required.read('[{"name": "f", "parameters": {}}]').calls == [("f", "{}")]
    assert required.read(
        '[{"name": "f", "parameters": {"a": [1, "]"]}}, {"name": "g", "parameters": {"b'
    ).calls == [
        ("f", '{"a": [1, "]"]}'),
        ("g", '{"b'),
    ]
    for text in ('[{"name": "f", "param', '{"name": "f"}', "[1]"):
        assert required.read(text).calls == [] and required.read(text).content == text
    named = ToolCalling(grammar="", named="f")  # the answer is the call, as written, cut short too
    assert named.read('{"a": 1}').calls == [("f", '{"a": 1}')] and named.read('{"a').calls == [("f", '{"a')]


CALL = '<tool_call>{"name": "get_weather", "arguments": {"city": "Rome", "days": 3}}</tool_call>'


def written(text: str) -> dict[str, Any]:
    """Makes the untrained model write `text` (a regex of it as the answer's one constraint)."""
    return {"structured_outputs": {"regex": re.escape(text)}}


@pytest.mark.parametrize(
    ("text", "content", "finish"),
    [
        (CALL, None, "tool_calls"),
        ("Let me look. " + CALL, "Let me look.", "tool_calls"),
        ("Rome is sunny.", "Rome is sunny.", "stop"),
        (CALL.replace("get_weather", "get_news"), CALL.replace("get_weather", "get_news"), "stop"),
    ],
)
def test_auto_reads_the_calls_the_model_writes(
    server: LiveServer, text: str, content: str | None, finish: str
) -> None:
    asked = {"model": CHAT, "messages": MESSAGES, "tools": [WEATHER, TIME], "max_tokens": 300}
    for tool_choice in ("auto", None):  # "auto" is the default with tools
        more = {"tool_choice": tool_choice} if tool_choice else {}
        answer = client(server).chat.completions.create(**asked, **more, extra_body=written(text))
        message = answer.choices[0].message
        assert (message.content, answer.choices[0].finish_reason) == (content, finish)
        if finish == "tool_calls":
            (call,) = message.tool_calls
            assert call.function.name == "get_weather" and call.id.startswith("call_")
            assert json.loads(call.function.arguments) == {"city": "Rome", "days": 3}
        else:
            assert message.tool_calls is None
        chunks = list(client(server).chat.completions.create(**asked, stream=True, extra_body=written(text)))
        deltas = [c.choices[0].delta for c in chunks if c.choices]
        assert "".join(d.content or "" for d in deltas) == (content or "")
        streamed = [(t.function.name, t.function.arguments) for d in deltas for t in d.tool_calls or []]
        assert streamed == [(t.function.name, t.function.arguments) for t in message.tool_calls or []]
        assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == finish


def test_parallel_tool_calls_false_makes_one_call_at_most(server: LiveServer) -> None:
    asked = {"model": CHAT, "messages": MESSAGES, "tools": [WEATHER, TIME], "parallel_tool_calls": False}
    for seed in range(4):
        answer = client(server).chat.completions.create(
            **asked, tool_choice="required", max_tokens=300, temperature=1.2, seed=seed
        )
        (call,) = answer.choices[0].message.tool_calls
        assert fits(call.function.name, call.function.arguments)
    two = CALL + CALL.replace("Rome", "Paris")
    answer = client(server).chat.completions.create(**asked, max_tokens=300, extra_body=written(two))
    (call,) = answer.choices[0].message.tool_calls  # the first the model wrote
    assert json.loads(call.function.arguments)["city"] == "Rome"
    answer = client(server).chat.completions.create(
        **(asked | {"parallel_tool_calls": True}), max_tokens=300, extra_body=written(two)
    )
    assert len(answer.choices[0].message.tool_calls) == 2
