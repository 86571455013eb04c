"""Triton's generate extension (service.api.v2_generate) on the tiny GPT-2: the same text as /v1/generate,
whole or streamed, in Triton's shape; every mistake a 400/404 naming what is wrong."""

from __future__ import annotations

import json
from typing import Any

import httpx
import pytest

from tests.service.v2.helpers import CLS, LM

PROMPT = "The film was"


def v1_text(base_url: str, **fields: Any) -> dict[str, Any]:
    body = {"model": LM, "prompt": PROMPT, "max_new_tokens": 8, **fields}
    r = httpx.post(f"{base_url}/v1/generate", json=body, timeout=30)
    assert r.status_code == 200, r.text
    return dict(r.json())


def events(r: httpx.Response) -> list[dict[str, Any]]:
    return [
        json.loads(line.removeprefix("data: ")) for line in r.text.splitlines() if line.startswith("data: ")
    ]


def test_generate_answers_what_v1_generate_answers(base_url: str) -> None:
    expected = v1_text(base_url)
    for path in (f"/v2/models/{LM}/generate", f"/v2/models/{LM}/versions/1/generate"):
        r = httpx.post(f"{base_url}{path}", json={"text_input": PROMPT, "parameters": {"max_tokens": 8}})
        assert r.status_code == 200, r.text
        assert r.json() == {
            "model_name": LM,
            "model_version": "1",
            "text_output": expected["generated_text"],
            "finish_reason": expected["finish_reason"],
            "tokens": expected["tokens"],
        }


def test_parameters_may_stand_at_the_top_level_and_the_id_comes_back(base_url: str) -> None:
    sampled = {"temperature": 0.9, "top_k": 5, "seed": 7, "max_new_tokens": 6}
    expected = v1_text(base_url, **sampled)
    r = httpx.post(
        f"{base_url}/v2/models/{LM}/generate", json={"text_input": PROMPT, "id": "req-1", **sampled}
    )
    assert r.status_code == 200, r.text
    assert r.json()["text_output"] == expected["generated_text"] and r.json()["id"] == "req-1"


def test_penalties_pass_through_as_on_v1_generate(base_url: str) -> None:
    shaped = {"presence_penalty": 1.5, "frequency_penalty": 0.5, "max_new_tokens": 12, "ignore_eos": True}
    expected = v1_text(base_url, **shaped)
    assert (
        expected["generated_text"] != v1_text(base_url, max_new_tokens=12, ignore_eos=True)["generated_text"]
    )
    r = httpx.post(f"{base_url}/v2/models/{LM}/generate", json={"text_input": PROMPT, "parameters": shaped})
    assert r.status_code == 200, r.text
    assert r.json()["text_output"] == expected["generated_text"]


def test_the_prompt_leads_the_output_when_asked(base_url: str) -> None:
    expected = v1_text(base_url)
    body = {"text_input": PROMPT, "parameters": {"max_tokens": 8, "exclude_input_in_output": False}}
    r = httpx.post(f"{base_url}/v2/models/{LM}/generate", json=body)
    assert r.json()["text_output"] == PROMPT + expected["generated_text"]


def test_generate_stream_sends_the_text_in_pieces_then_how_it_ended(base_url: str) -> None:
    expected = v1_text(base_url, max_new_tokens=12, ignore_eos=True)
    body = {"text_input": PROMPT, "parameters": {"max_tokens": 12, "ignore_eos": True}, "id": "s"}
    r = httpx.post(f"{base_url}/v2/models/{LM}/generate_stream", json=body, timeout=30)
    assert r.status_code == 200 and r.headers["content-type"].startswith("text/event-stream")
    got = events(r)
    assert "".join(e["text_output"] for e in got) == expected["generated_text"]
    assert all(e["model_name"] == LM and e["model_version"] == "1" and e["id"] == "s" for e in got)
    assert [e["finish_reason"] for e in got[:-1]] == [None] * (len(got) - 1)
    assert (got[-1]["finish_reason"], got[-1]["tokens"]) == ("length", 12)


@pytest.mark.parametrize(
    ("path", "body", "status", "message"),
    [
        (f"/v2/models/{LM}/generate", {"parameters": {}}, 400, "text_input: expected a non-empty string"),
        (f"/v2/models/{LM}/generate", ["a list"], 400, "expected a JSON object"),
        (
            f"/v2/models/{LM}/generate",
            {"text_input": "x", "end_id": 2},
            400,
            "parameters.end_id: not a parameter",
        ),
        (f"/v2/models/{LM}/generate", {"text_input": "x", "temperature": -1}, 400, "parameters.temperature"),
        (f"/v2/models/{LM}/generate", {"text_input": "x", "max_tokens": 0}, 400, "parameters.max_tokens"),
        (
            f"/v2/models/{LM}/generate",
            {"text_input": "x", "max_tokens": 2, "parameters": {"max_tokens": 3}},
            400,
            "both at the top level and in parameters: max_tokens",
        ),
        (f"/v2/models/{LM}/generate_stream", {"text_input": "x", "stream": "yes"}, 400, "parameters.stream"),
        (f"/v2/models/{CLS}/generate", {"text_input": "x"}, 400, "serves text-classification"),
        (f"/v2/models/{LM}/versions/9/generate", {"text_input": "x"}, 404, "has no version 9"),
        ("/v2/models/nope/generate_stream", {"text_input": "x"}, 404, "nope"),
        (f"/v2/models/{LM}/generate_stream", {"text_input": "word " * 5000}, 400, "the prompt is"),
    ],
)
def test_mistakes_are_v2_errors_that_say_what_is_wrong(
    base_url: str, path: str, body: Any, status: int, message: str
) -> None:
    r = httpx.post(f"{base_url}{path}", json=body, timeout=30)
    assert r.status_code == status, r.text
    assert r.headers["content-type"] == "application/json"  # a stream refused before it started, too
    assert message in r.json()["error"]


def test_the_server_says_it_speaks_the_extension(base_url: str) -> None:
    assert "generate" in httpx.get(f"{base_url}/v2").json()["extensions"]
