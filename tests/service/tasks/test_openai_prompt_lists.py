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
from service.tasks.generation_base import Prepared, merged_streams, open_streams
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


def test_n_answers_per_prompt_each_reproducible_by_its_seed(server: LiveServer) -> None:
    client = openai_client(server)
    ask: dict[str, Any] = {"model": CHAT, "max_tokens": 8, "temperature": 1.5, "seed": 7}
    three = client.completions.create(prompt=PROMPTS[:2], n=3, **ask)
    assert [c.index for c in three.choices] == list(range(6))  # prompt i's j-th answer at i * 3 + j
    for i, prompt in enumerate(PROMPTS[:2]):
        for j in range(3):  # the j-th answer is the one seed + j gives alone
            alone = client.completions.create(prompt=prompt, **{**ask, "seed": 7 + j})
            assert three.choices[i * 3 + j].text == alone.choices[0].text
    assert len({c.text for c in three.choices[:3]}) > 1  # sampled apart
    single = [client.completions.create(prompt=p, **ask) for p in PROMPTS[:2]]
    assert three.usage is not None and three.usage.prompt_tokens == sum(
        s.usage.prompt_tokens for s in single if s.usage
    )  # a prompt counts once

    chat = client.chat.completions.create(
        model=CHAT,
        messages=[{"role": "user", "content": "Hi"}],
        n=2,
        max_tokens=6,
        temperature=0,
        stream=True,
    )
    texts: dict[int, str] = {}
    for chunk in chat:
        for choice in chunk.choices:
            texts[choice.index] = texts.get(choice.index, "") + (choice.delta.content or "")
    assert sorted(texts) == [0, 1] and texts[0] == texts[1]  # greedy: the same answer twice


def test_too_many_choices_are_refused(server: LiveServer) -> None:
    body = {"model": CHAT, "prompt": ["hi"] * 40, "n": 2, "max_tokens": 2}
    r = httpx.post(f"{server.base_url}/v1/completions", json=body, timeout=30)
    assert r.status_code == 400 and "40 prompts x n 2 is more than 64 choices" in r.json()["error"]["message"]


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
        return [item async for item in merged_streams(streams)]  # type: ignore[arg-type]

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
        opened = await open_streams(ready)
        assert [seq.prompt for seq, _ in opened] == [[1], [2]]
        for _, groups in opened:
            await groups.aclose()  # type: ignore[attr-defined]
        with pytest.raises(RuntimeError, match="queue full"):
            await open_streams([Prepared(engine, [n], params) for n in (3, 0, 4)])  # type: ignore[arg-type]

    asyncio.run(main())
    assert sorted(engine.closed) == [1, 2, 3, 4]  # none left running for nobody


def test_a_client_leaving_a_merged_stream_closes_every_prompts_stream() -> None:
    closed: list[int] = []

    async def stream(i: int) -> AsyncIterator[list[Any]]:
        try:
            while True:
                await asyncio.sleep(0.01 * (i + 1))
                yield [i]
        finally:
            closed.append(i)  # the engine side frees the sequence here (stream_groups' own finally)

    async def main() -> None:
        merged = merged_streams([stream(0), stream(1), stream(2)])  # type: ignore[list-item]
        assert await anext(merged) == (0, [0])
        await merged.aclose()  # type: ignore[attr-defined]

    asyncio.run(main())
    assert sorted(closed) == [0, 1, 2]
