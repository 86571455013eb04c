"""The sampling and constraint fields over HTTP on the tiny GPT-2 (/v1/completions, /v1/generate): OpenAI's
logit bias and penalties, vLLM's structured outputs, min_tokens and stop_token_ids, TGI's grammar; each does
what it says and each bad value is a clear 4xx."""

from __future__ import annotations

import json
import re
from typing import Any

import pytest
from fastapi.testclient import TestClient

from tests.conftest import TASK_MODEL_NAMES
from tests.service.generation.helpers import error

LM = TASK_MODEL_NAMES["text-generation"]


# -- logit bias and penalties -------------------------------------------------------------------------------


def test_a_logit_bias_forces_and_bans_tokens(client: TestClient) -> None:
    body = {"model": LM, "prompt": [5, 9, 13], "max_tokens": 4, "temperature": 0}
    plain = client.post("/v1/completions", json=body).json()["choices"][0]["text"]
    forced = client.post("/v1/completions", json={**body, "logit_bias": {"42": 100}}).json()
    want = client.post("/detokenize", json={"model": LM, "tokens": [42] * 4}).json()["prompt"]
    assert forced["choices"][0]["text"] == want != plain
    first = client.post("/v1/completions", json={**body, "max_tokens": 1, "logprobs": 0}).json()
    best = client.post("/tokenize", json={"model": LM, "prompt": first["choices"][0]["text"]}).json()
    banned = {str(t): -100 for t in best["tokens"]}
    again = client.post("/v1/completions", json={**body, "max_tokens": 1, "logit_bias": banned})
    assert again.status_code == 200 and again.json()["choices"][0]["text"] != first["choices"][0]["text"]


@pytest.mark.parametrize("path", ["/v1/generate", "/v1/completions"])
def test_presence_and_frequency_penalties_change_the_greedy_text(client: TestClient, path: str) -> None:
    length = "max_new_tokens" if path == "/v1/generate" else "max_tokens"
    body = {"prompt": "The film was", length: 16, "temperature": 0, "ignore_eos": True}
    key = "generated_text" if path == "/v1/generate" else "choices"
    texts = [
        client.post(path, json={**body, **extra}).json()[key]
        for extra in ({}, {"frequency_penalty": 2.0}, {"presence_penalty": 2.0}, {"frequency_penalty": 0})
    ]
    assert texts[0] != texts[1] and texts[0] != texts[2] and texts[0] == texts[3]


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"logit_bias": {"x": 1}}, "logit_bias: 'x' is not a token id"),
        ({"logit_bias": {"01": 1}}, "logit_bias: '01' is not a token id"),
        (
            {"logit_bias": {"1": 101}},
            "logit_bias: the bias of token 1 must be a number in [-100, 100]",
        ),
        ({"logit_bias": {"1": "5"}}, "logit_bias: the bias of token 1 must be a number"),
        ({"logit_bias": [1, 2]}, "logit_bias: expected an object mapping token ids to biases"),
        ({"logit_bias": {"99999999": 1}}, "logit_bias: token ids must be in [0, "),
        ({"presence_penalty": 2.5}, "presence_penalty: Input should be less than or equal to 2"),
        ({"frequency_penalty": -3}, "frequency_penalty: Input should be greater than or equal to -2"),
        ({"frequency_penalty": "1"}, "frequency_penalty: Input should be a valid number"),
    ],
)
def test_bad_bias_and_penalties_are_clear(client: TestClient, change: dict[str, Any], message: str) -> None:
    r = client.post("/v1/completions", json={"model": LM, "prompt": "hi", "max_tokens": 2, **change})
    assert message in error(r)


# -- constrained answers: vLLM's structured_outputs and guided_*, text-generation-inference's grammar ----


@pytest.mark.parametrize(
    ("constraint", "accepts"),
    [
        (
            {"structured_outputs": {"choice": ["yes", "no", "maybe so"]}},
            lambda t: t in ("yes", "no", "maybe so"),
        ),
        ({"guided_choice": ["red", "green"]}, lambda t: t in ("red", "green")),
        (
            {"structured_outputs": {"regex": "[0-9]{3}-[a-c]{1,4}"}},
            lambda t: re.fullmatch("[0-9]{3}-[a-c]{1,4}", t),
        ),
        ({"guided_regex": "(film|book)s?"}, lambda t: re.fullmatch("(film|book)s?", t)),
        ({"structured_outputs": {"grammar": 'start: "A" | "B" "!"?'}}, lambda t: re.fullmatch("A|B!?", t)),
        (
            {
                "guided_json": {
                    "type": "object",
                    "properties": {"n": {"enum": [1, 2]}},
                    "required": ["n"],
                    "additionalProperties": False,
                }
            },
            lambda t: json.loads(t)["n"] in (1, 2),
        ),
    ],
)
def test_a_constraint_keeps_the_answer_inside_it(
    client: TestClient, constraint: dict[str, Any], accepts: Any
) -> None:
    body = {"model": LM, "prompt": "The film was", "max_tokens": 24, **constraint}
    for extra in ({"temperature": 0}, {"temperature": 1.2, "seed": 4}):
        r = client.post("/v1/completions", json={**body, **extra})
        assert r.status_code == 200, r.text
        choice = r.json()["choices"][0]
        assert choice["finish_reason"] == "stop" and accepts(choice["text"]), choice


def test_tgi_grammar_on_v1_generate(client: TestClient) -> None:
    body = {
        "prompt": "The film was",
        "max_new_tokens": 24,
        "grammar": {"type": "regex", "value": "[a-c]{2}!"},
    }
    r = client.post("/v1/generate", json=body)
    assert r.status_code == 200, r.text
    assert re.fullmatch("[a-c]{2}!", r.json()["generated_text"]) and r.json()["finish_reason"] == "eos"
    schema = {"type": "object", "properties": {"ok": {"type": "boolean"}}, "required": ["ok"]}
    r = client.post("/v1/generate", json={**body, "grammar": {"type": "json", "value": schema}})
    assert isinstance(json.loads(r.json()["generated_text"])["ok"], bool)


@pytest.mark.parametrize(
    ("path", "change", "message"),
    [
        ("/v1/completions", {"guided_regex": "("}, "guided_regex: the regex cannot be compiled"),
        ("/v1/completions", {"structured_outputs": {"choice": []}}, "a choice is a non-empty list"),
        ("/v1/completions", {"structured_outputs": {"xml": "<a/>"}}, "'xml' is not one of json, regex"),
        ("/v1/completions", {"structured_outputs": "yes"}, "expected an object with one of json"),
        (
            "/v1/completions",
            {"guided_choice": ["a"], "response_format": {"type": "json_object"}},
            "one constraint on the answer at most, not response_format, guided_choice",
        ),
        ("/v1/generate", {"grammar": {"type": "lark", "value": "x"}}, 'expected {"type": "json"'),
        ("/v1/generate", {"grammar": {"type": "regex", "value": "[z-a]"}}, "the regex cannot be compiled"),
    ],
)
def test_bad_constraints_are_clear(
    client: TestClient, path: str, change: dict[str, Any], message: str
) -> None:
    length = "max_tokens" if path == "/v1/completions" else "max_new_tokens"
    r = client.post(path, json={"model": LM, "prompt": "hi", length: 2, **change})
    assert message in error(r)


# -- vLLM's min_tokens and stop_token_ids --------------------------------------------------------------------


def test_min_tokens_and_stop_token_ids_over_http(client: TestClient) -> None:
    eos_text = client.get("/tokenizer_info", params={"model": LM}).json()["eos_token"]
    (eos,) = client.post("/tokenize", json={"model": LM, "prompt": eos_text}).json()["tokens"]
    body = {
        "model": LM,
        "prompt": [5, 9, 13],
        "max_tokens": 12,
        "temperature": 0,
        "logit_bias": {str(eos): 100},
    }
    at_once = client.post("/v1/completions", json=body).json()
    assert at_once["usage"]["completion_tokens"] == 1 and at_once["choices"][0]["finish_reason"] == "stop"
    held = client.post("/v1/completions", json={**body, "min_tokens": 6}).json()
    assert held["usage"]["completion_tokens"] == 7 and held["choices"][0]["finish_reason"] == "stop"
    greedy = {"model": LM, "prompt": [5, 9, 13], "max_tokens": 12, "temperature": 0}
    text = client.post("/v1/completions", json={**greedy, "max_tokens": 1}).json()["choices"][0]["text"]
    (first,) = client.post("/tokenize", json={"model": LM, "prompt": text}).json()["tokens"]
    stopped = client.post("/v1/completions", json={**greedy, "stop_token_ids": [first]}).json()
    assert stopped["usage"]["completion_tokens"] == 1 and stopped["choices"][0]["finish_reason"] == "stop"


def test_no_stop_string_counts_before_min_tokens(client: TestClient) -> None:
    body = {"prompt": "I loved this film, it was", "max_new_tokens": 12, "ignore_eos": True}
    text = client.post("/v1/generate", json=body).json()["generated_text"]  # " was wonderful wonderful ..."
    stop = " wonderful"
    cut = client.post("/v1/generate", json={**body, "stop": [stop]}).json()
    assert cut["finish_reason"] == "stop" and cut["generated_text"] == text[: text.index(stop)]
    later = client.post("/v1/generate", json={**body, "stop": [stop], "min_tokens": 12}).json()
    assert later["tokens"] == 12  # the stop string counts again from the 12th token: it ends there
    assert later["generated_text"] == text[: text.rindex(stop)] and later["finish_reason"] == "stop"


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"min_tokens": 5, "max_tokens": 2}, "min_tokens (5) is more than the tokens asked for (2)"),
        ({"stop_token_ids": [99999999]}, "stop_token_ids must be in [0, "),
        ({"stop_token_ids": [-1]}, "stop_token_ids must be in [0, "),
        ({"min_tokens": -1}, "min_tokens: Input should be greater than or equal to 0"),
    ],
)
def test_bad_min_tokens_and_stop_token_ids_are_clear(
    client: TestClient, change: dict[str, Any], message: str
) -> None:
    r = client.post("/v1/completions", json={"model": LM, "prompt": "hi", "max_tokens": 2, **change})
    assert message in error(r)
