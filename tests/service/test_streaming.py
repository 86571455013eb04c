"""Streaming generation on a real uvicorn: SSE events as tokens come, and the official openai client."""

from __future__ import annotations

import asyncio
import json
import shutil
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from tests.conftest import TASK_MODEL_NAMES
from tests.service.live_server import LiveServer, live_server

LM = TASK_MODEL_NAMES["text-generation"]


@pytest.fixture(scope="module")
def server(tiny_repository: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[LiveServer]:
    """The tiny repository plus a GPT-2 with a 1024-token window: long generations to watch stream."""
    from export.pipeline import export_model
    from tests.tiny_models import build_tiny

    root = tmp_path_factory.mktemp("streaming")
    repository = root / "repo"
    shutil.copytree(tiny_repository, repository)
    long_lm = build_tiny("text-generation", root / "long-lm", positions=1024)
    assert export_model(long_lm, "text-generation", "long-lm", repository, ("fp32",)).version_dir is not None
    with live_server(repository) as s:
        yield s


def running_and_generated(server: LiveServer) -> tuple[float, float]:
    text = httpx.get(f"{server.base_url}/metrics").text
    values = {}
    for name in ("distilserve_running_sequences", "distilserve_generated_tokens_total"):
        line = next(x for x in text.splitlines() if x.startswith(f'{name}{{model="long-lm"}}'))
        values[name] = float(line.split()[-1])
    return values["distilserve_running_sequences"], values["distilserve_generated_tokens_total"]


def test_sse_events_arrive_while_generating(server: LiveServer) -> None:
    body = {"prompt": "Acme was", "max_new_tokens": 1000, "model": "long-lm", "stream": True}
    _, generated_before = running_and_generated(server)
    events = []
    with httpx.stream("POST", f"{server.base_url}/v1/generate", json=body, timeout=60) as response:
        assert response.status_code == 200
        assert response.headers["content-type"].startswith("text/event-stream")
        for line in response.iter_lines():
            if not line.startswith("data: "):
                continue
            events.append(json.loads(line[len("data: ") :]))
            if len(events) == 1:  # the first token is here: the sequence must still be generating
                running, generated = running_and_generated(server)
                assert running == 1 and generated - generated_before < 1000, (
                    running,
                    generated - generated_before,
                )
    final = events[-1]
    assert final["finish_reason"] in ("length", "eos") and final["tokens"] == len(events) - 1
    assert final["generated_text"] == "".join(e["text"] for e in events[:-1])
    whole = httpx.post(f"{server.base_url}/v1/generate", json={**body, "stream": False}, timeout=60).json()
    assert whole["generated_text"] == final["generated_text"]


def test_openai_client_completions_plain_and_streamed(server: LiveServer) -> None:
    from openai import OpenAI

    client = OpenAI(base_url=f"{server.base_url}/v1", api_key="unused", max_retries=0)
    plain = client.completions.create(model=LM, prompt="I loved this film", max_tokens=12, temperature=0)
    text = plain.choices[0].text
    assert plain.usage is not None and plain.usage.completion_tokens >= 1
    assert plain.choices[0].finish_reason in ("stop", "length")
    chunks = client.completions.create(
        model=LM, prompt="I loved this film", max_tokens=12, temperature=0, stream=True
    )
    streamed = "".join(c.choices[0].text for c in chunks if c.choices)
    assert streamed == text


def test_openai_errors_are_clear(server: LiveServer) -> None:
    from openai import BadRequestError, NotFoundError, OpenAI

    client = OpenAI(base_url=f"{server.base_url}/v1", api_key="unused", max_retries=0)
    with pytest.raises(NotFoundError, match="'no-such-model' is not served"):
        client.completions.create(model="no-such-model", prompt="hi", max_tokens=4)
    with pytest.raises(BadRequestError, match="n: Input should be less than or equal to 16"):
        client.completions.create(model=LM, prompt="hi", max_tokens=4, n=17)
    assert LM in {m.id for m in client.models.list()}
    assert client.models.retrieve(LM).id == LM
    with pytest.raises(NotFoundError, match="'nope' is not served"):
        client.models.retrieve("nope")


@pytest.mark.parametrize(
    ("path", "body"),
    [
        ("/v1/generate", {"prompt": "Acme was", "max_new_tokens": 200, "ignore_eos": True}),
        ("/v1/completions", {"prompt": "Acme was", "max_tokens": 200, "ignore_eos": True}),
    ],
)
def test_a_stream_that_finds_the_queue_full_gets_a_429_not_a_cut_stream(
    tiny_repository: Path, tmp_path: Path, path: str, body: dict[str, object]
) -> None:
    """One sequence decodes, one waits: of six streams at once, the rest are refused before any byte."""
    repository = tmp_path / "repo"
    shutil.copytree(tiny_repository, repository)
    env = {
        "DISTILSERVE_GEN_MAX_BATCH": "1",
        "DISTILSERVE_GEN_MAX_WAITING": "1",
        "DISTILSERVE_WARMUP": "false",
    }

    async def six_streams(base: str) -> list[tuple[int, str, dict[str, str]]]:
        async with httpx.AsyncClient(base_url=base, timeout=60) as client:

            async def one() -> tuple[int, str, dict[str, str]]:
                request = {**body, "model": "long-lm", "stream": True}
                async with client.stream("POST", path, json=request) as response:
                    return response.status_code, (await response.aread()).decode(), dict(response.headers)

            return await asyncio.gather(*(one() for _ in range(6)))

    from export.pipeline import export_model
    from tests.tiny_models import build_tiny

    long_lm = build_tiny("text-generation", tmp_path / "long-lm", positions=1024)
    assert export_model(long_lm, "text-generation", "long-lm", repository, ("fp32",)).version_dir is not None
    with live_server(repository, env) as server:
        outcomes = asyncio.run(six_streams(server.base_url))
    statuses = sorted(status for status, _, _ in outcomes)
    assert statuses.count(200) >= 1 and statuses.count(429) >= 1 and set(statuses) == {200, 429}
    for status, text, headers in outcomes:
        if status == 429:
            error = json.loads(text)
            kind = error["error"]["type"] if path == "/v1/completions" else error["error_type"]  # OpenAI's
            assert kind == "overloaded" and int(headers["retry-after"]) >= 1
        else:
            assert text.rstrip().endswith("data: [DONE]" if path == "/v1/completions" else "}")
            assert '"error"' not in text and '"finish_reason":"length"' in text
