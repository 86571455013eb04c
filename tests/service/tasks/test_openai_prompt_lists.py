"""/v1/completions with a list of prompts (as vLLM takes it, and as evaluation harnesses send batches): one
choice per prompt at its index, each the answer that prompt gets alone, decoded together; streamed chunks
say which choice they extend; a failing prompt takes the request down without leaving the others running."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from service.generation.sampling import SamplingParams
from service.generation.sequence import Sequence, TokenEvent
from service.tasks.generation_base import Prepared
from service.tasks.openai_generation import _merged, _open_all
from tests.service.live_server import LiveServer, live_server
from tests.service.tasks.test_openai_generation import CHAT, openai_client
from tests.service.tasks.test_openai_generation import repository as repository  # the module's fixture

PROMPTS = ["Acme was founded", "I loved this film", "Who", "The garage"]


@pytest.fixture(scope="module")
def server(repository: Path) -> Iterator[LiveServer]:
    with live_server(repository) as s:
        yield s


def test_each_prompt_gets_its_own_answer_at_its_index(server: LiveServer) -> None:
    client = openai_client(server)
    ask: dict[str, Any] = {"model": CHAT, "max_tokens": 8, "temperature": 0}
    alone = [client.completions.create(prompt=p, **ask) for p in PROMPTS]
    together = client.completions.create(prompt=PROMPTS, **ask)
    assert [c.index for c in together.choices] == [0, 1, 2, 3]
    assert [c.text for c in together.choices] == [a.choices[0].text for a in alone]
    assert [c.finish_reason for c in together.choices] == [a.choices[0].finish_reason for a in alone]
    assert together.usage is not None
    assert together.usage.prompt_tokens == sum(a.usage.prompt_tokens for a in alone if a.usage)
    assert together.usage.completion_tokens == sum(a.usage.completion_tokens for a in alone if a.usage)


def test_a_streamed_list_says_which_choice_each_chunk_extends(server: LiveServer) -> None:
    body = {
        "model": CHAT,
        "prompt": PROMPTS,
        "max_tokens": 8,
        "temperature": 0,
        "echo": True,
        "logprobs": 1,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    whole = httpx.post(f"{server.base_url}/v1/completions", json={**body, "stream": False}, timeout=60).json()
    with httpx.stream("POST", f"{server.base_url}/v1/completions", json=body, timeout=60) as r:
        events = [json.loads(line[6:]) for line in r.iter_lines() if line.startswith("data: {")]
    *chunks, usage = events
    texts: dict[int, str] = {}
    tokens: dict[int, list[str]] = {}
    finishes: dict[int, list[str]] = {}
    for chunk in chunks:
        (choice,) = chunk["choices"]
        i = choice["index"]
        texts[i] = texts.get(i, "") + choice["text"]
        tokens.setdefault(i, []).extend((choice["logprobs"] or {}).get("tokens", []))
        if choice["finish_reason"]:
            finishes.setdefault(i, []).append(choice["finish_reason"])
    for choice in whole["choices"]:
        i = choice["index"]
        assert texts[i] == choice["text"] and texts[i].startswith(PROMPTS[i])  # echoed, then generated
        assert tokens[i] == choice["logprobs"]["tokens"]
        assert finishes[i] == [choice["finish_reason"]]  # once, on its last chunk
    assert usage["choices"] == [] and usage["usage"] == whole["usage"]


def test_a_prompt_too_long_refuses_the_whole_list(server: LiveServer) -> None:
    body = {"model": CHAT, "prompt": ["fine", "word " * 5000], "max_tokens": 4}
    r = httpx.post(f"{server.base_url}/v1/completions", json=body, timeout=60)
    assert r.status_code == 400 and "the prompt is" in r.json()["error"]["message"]


def test_merged_streams_interleave_as_their_groups_come_and_all_close() -> None:
    closed: list[int] = []

    async def stream(i: int, delays: list[float]) -> AsyncIterator[list[Any]]:
        try:
            for n, delay in enumerate(delays):
                await asyncio.sleep(delay)
                yield [f"{i}.{n}"]
        finally:
            closed.append(i)

    async def main() -> list[tuple[int, list[Any]]]:
        streams = [stream(0, [0.0, 0.05, 0.05]), stream(1, [0.02, 0.0])]
        return [item async for item in _merged(streams)]  # type: ignore[arg-type]

    assert asyncio.run(main()) == [(0, ["0.0"]), (1, ["1.0"]), (1, ["1.1"]), (0, ["0.1"]), (0, ["0.2"])]
    assert sorted(closed) == [0, 1]


class FakeStreams:
    """An engine's stream side: a prompt [0] is refused at submission; others stream one group, then wait."""

    def __init__(self) -> None:
        self.closed: list[int] = []

    def submit(self, prompt: list[int], params: Any, traced: bool = False) -> Sequence:
        if prompt == [0]:
            raise RuntimeError("queue full")
        return Sequence(prompt=prompt, params=params)

    async def stream_groups(self, seq: Sequence) -> AsyncIterator[list[TokenEvent]]:
        try:
            yield [TokenEvent(1, "a")]
            await asyncio.sleep(10)
        finally:
            self.closed.append(seq.prompt[0])


def test_a_refused_prompt_closes_the_streams_already_open() -> None:
    engine = FakeStreams()
    params = SamplingParams()

    async def main() -> None:
        ready = [Prepared(engine, [n], params) for n in (1, 2)]  # type: ignore[arg-type]
        opened = await _open_all(ready)
        assert [seq.prompt for seq, _ in opened] == [[1], [2]]
        for _, groups in opened:
            await groups.aclose()  # type: ignore[attr-defined]
        with pytest.raises(RuntimeError, match="queue full"):
            await _open_all([Prepared(engine, [n], params) for n in (3, 0, 4)])  # type: ignore[arg-type]

    asyncio.run(main())
    assert sorted(engine.closed) == [1, 2, 3, 4]  # none left running for nobody
