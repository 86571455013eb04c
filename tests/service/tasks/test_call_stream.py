"""Calls written under a grammar read as they grow: however the answer's tokens fall, the calls a stream
sends (each call's id and name first, then its arguments in fragments) join into the whole answer's, cut
short too; text with no whole call's head is text, and whole calls whose keys come in another order are
still read, at the end."""

from __future__ import annotations

from typing import Any

import pytest

from service.generation.sequence import TokenEvent
from service.tasks.call_stream import CallStream
from service.tasks.openai_generation import Choice, _tool_chunks, tool_shape
from service.tasks.openai_tools import ToolCalling

REQUIRED = ToolCalling("<a grammar>", names=frozenset({"get_weather", "get_time"}))
ANSWERS = [
    '[{"name": "get_weather", "parameters": {"city": "Pa\\"ris]", "days": [1, {"a": "}"}]}}]',
    '[{"name": "get_weather", "parameters": {"city": "Rome"}}, {"name": "get_time", "parameters": {}}]',
    '[{"name": "get_time", "parameters": {"zone": "UT',  # cut at the token limit
    '[{"name": "get_ti',  # cut inside the first head: no call yet
    '[{"parameters": {"zone": "UTC"}, "name": "get_time"}]',  # another key order: read whole at the end
]


def streamed(calling: ToolCalling, pieces: list[str], finish: str) -> tuple[list[Any], str | None, str]:
    """The calls a client joins from the stream ((name, arguments) each), the finish reason, the text."""
    choice = Choice(prepared=None)  # type: ignore[arg-type]
    chunks = []
    for i, piece in enumerate(pieces):
        last = i == len(pieces) - 1
        event = TokenEvent(i, piece, finish if last else None, i)  # type: ignore[arg-type]
        chunks += _tool_chunks(calling, choice, event)
    calls: dict[int, list[Any]] = {}
    for c in chunks:
        for delta in c["delta"].get("tool_calls", []):
            calls.setdefault(delta["index"], []).append(delta["function"])
    joined = [(f[0]["name"], "".join(d["arguments"] for d in f)) for f in calls.values()]
    text = "".join(c["delta"].get("content", "") for c in chunks)
    return joined, chunks[-1]["finish_reason"], text


@pytest.mark.parametrize("answer", ANSWERS)
@pytest.mark.parametrize("size", [1, 2, 5, 1000])
def test_streamed_calls_join_into_the_whole_answers(answer: str, size: int) -> None:
    finish = "length" if not answer.endswith("]") else "eos"
    reason = "length" if finish == "length" else "stop"
    whole = tool_shape(REQUIRED).choice(answer, reason, None)
    calls, got_finish, text = streamed(
        REQUIRED, [answer[i : i + size] for i in range(0, len(answer), size)], finish
    )
    wanted = [
        (c["function"]["name"], c["function"]["arguments"]) for c in whole["message"].get("tool_calls") or []
    ]
    assert calls == wanted and got_finish == whole["finish_reason"]
    assert text == (whole["message"]["content"] or "")


def test_each_call_is_read_as_written() -> None:
    whole = tool_shape(REQUIRED).choice(ANSWERS[1], "stop", None)
    assert [c["function"]["arguments"] for c in whole["message"]["tool_calls"]] == ['{"city": "Rome"}', "{}"]
    assert whole["finish_reason"] == "tool_calls"
    cut = tool_shape(REQUIRED).choice(ANSWERS[2], "length", None)
    assert cut["message"]["tool_calls"][0]["function"]["arguments"] == '{"zone": "UT'
    assert cut["finish_reason"] == "length"
    assert tool_shape(REQUIRED).choice(ANSWERS[3], "length", None)["message"]["content"] == ANSWERS[3]


def test_a_named_calls_answer_is_its_arguments_from_the_first_token() -> None:
    stream = CallStream(named="get_time")
    first, *rest = stream.feed("") + stream.feed('{"zone"') + stream.feed("") + stream.feed(': "UTC"}')
    assert (first.name, first.arguments) == ("get_time", "")
    assert [(p.name, p.arguments) for p in rest] == [(None, '{"zone"'), (None, ': "UTC"}')]
    assert stream.calls == [("get_time", '{"zone": "UTC"}')]
