"""/v1/generate and /v1/completions over HTTP on the tiny GPT-2: bad input is a clear 422 (400 on OpenAI's
route), never a 500."""

from __future__ import annotations

import json
import logging
import re
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient

from service.app import create_app
from service.engine import EngineError
from service.runtime import ort_engine_factory
from service.settings import Settings
from tests.conftest import TASK_MODEL_NAMES

LM = TASK_MODEL_NAMES["text-generation"]
BUDGET = 16  # cached tokens one request may reserve: far below the tiny model's 64-token window


@pytest.fixture(scope="module")
def lm_repository(tmp_path_factory: pytest.TempPathFactory, tiny_repository: Path) -> Path:
    """The tiny repository's language model alone: the apps here need nothing else."""
    repository = tmp_path_factory.mktemp("lm-only")
    shutil.copytree(tiny_repository / LM, repository / LM)
    return repository


@pytest.fixture(scope="module")
def client(lm_repository: Path) -> Iterator[TestClient]:
    with TestClient(create_app(Settings(model_repository=lm_repository))) as c:
        yield c


@pytest.fixture(scope="module")
def small_budget(lm_repository: Path) -> Iterator[TestClient]:
    settings = Settings(model_repository=lm_repository, gen_max_cached_tokens=BUDGET)
    with TestClient(create_app(settings)) as c:
        yield c


def error(r: Any) -> str:
    """The refusal's message, from either shape: ours (422, "validation"), or OpenAI's on /v1/completions
    (400, "invalid_request_error", as OpenAI and vLLM answer)."""
    body = r.json()
    if isinstance(body["error"], dict):
        assert r.status_code == 400, r.text
        assert body["error"]["type"] == "invalid_request_error", body
        return str(body["error"]["message"])
    assert r.status_code == 422, r.text
    assert body["error_type"] == "validation", body
    return str(body["error"])


# -- tiny temperatures ---------------------------------------------------------------------------------


@pytest.mark.filterwarnings("error::RuntimeWarning")  # raised on the engine thread: fails it
def test_a_tiny_temperature_generates_the_greedy_text(client: TestClient) -> None:
    body = {"prompt": "The film was", "max_new_tokens": 8, "seed": 1}
    greedy = client.post("/v1/generate", json=body).json()
    for temperature in (1e-38, 1e-37, 5e-324):
        r = client.post("/v1/generate", json={**body, "temperature": temperature})
        assert r.status_code == 200, r.text
        assert r.json() == greedy, temperature


@pytest.mark.filterwarnings("error::RuntimeWarning")  # raised on the engine thread: fails it
def test_a_tiny_repetition_penalty_samples_real_tokens(client: TestClient) -> None:
    body = {"prompt": "The film was", "max_new_tokens": 8, "seed": 1, "temperature": 0.8}
    r = client.post("/v1/generate", json={**body, "repetition_penalty": 1e-300})
    assert r.status_code == 200, r.text
    assert r.json()["tokens"] >= 1


def test_a_seed_beyond_int64_is_refused_and_the_largest_one_serves(client: TestClient) -> None:
    # found by tests/service/test_openapi_fuzz.py: a seed past 2**64 was a 500 (engine messages carry int64)
    for path, length, text in (
        ("/v1/generate", "max_new_tokens", lambda r: r["generated_text"]),
        ("/v1/completions", "max_tokens", lambda r: r["choices"][0]["text"]),
    ):
        body = {"prompt": "The film was", "temperature": 0.8, length: 4}
        assert "seed" in error(client.post(path, json={**body, "seed": 2**64}))
        twice = [client.post(path, json={**body, "seed": 2**63 - 1}) for _ in range(2)]
        assert [r.status_code for r in twice] == [200, 200], twice[0].text
        assert text(twice[0].json()) == text(twice[1].json())


# -- the cache budget ------------------------------------------------------------------------------------


def events(r: Any) -> list[dict[str, Any]]:
    return [json.loads(line[len("data: ") :]) for line in r.text.splitlines() if line.startswith("data: {")]


def test_max_new_tokens_is_capped_to_the_cache_budget(small_budget: TestClient) -> None:
    r = small_budget.post("/v1/generate", json={"prompt": "a", "max_new_tokens": 100, "ignore_eos": True})
    assert r.status_code == 200, r.text
    assert r.json()["tokens"] == BUDGET - 1  # "a" is one token
    streamed = small_budget.post("/v1/generate", json={"prompt": "a", "max_new_tokens": 100, "stream": True})
    assert streamed.status_code == 200, streamed.text
    final = events(streamed)[-1]
    assert final["finish_reason"] in ("length", "eos") and 1 <= final["tokens"] <= BUDGET - 1
    completion = small_budget.post("/v1/completions", json={"prompt": "a", "max_tokens": 100})
    assert completion.status_code == 200, completion.text
    assert completion.json()["usage"]["total_tokens"] <= BUDGET


def test_a_prompt_over_the_cache_budget_is_a_clear_422(small_budget: TestClient) -> None:
    prompt = "the film was good " * 6  # inside the 64-token window, over the budget
    message = error(small_budget.post("/v1/generate", json={"prompt": prompt, "max_new_tokens": 1}))
    assert message.startswith("the prompt is ") and f"at most {BUDGET} tokens" in message
    assert "DISTILSERVE_GEN_MAX_CACHED_TOKENS" in message
    assert error(small_budget.post("/v1/completions", json={"prompt": prompt})) == message
    streamed = small_budget.post("/v1/generate", json={"prompt": prompt, "stream": True})
    assert error(streamed) == message


def test_truncate_prompt_keeps_the_end_that_fits_the_budget(small_budget: TestClient) -> None:
    body = {"prompt": "the film was good " * 6, "max_new_tokens": 4, "truncate_prompt": True}
    r = small_budget.post("/v1/generate", json=body)
    assert r.status_code == 200, r.text
    assert r.json()["tokens"] == 1  # the prompt's last BUDGET - 1 tokens leave room for one


def test_a_prompt_over_the_window_still_names_the_window(small_budget: TestClient) -> None:
    assert "window is 64 tokens" in error(small_budget.post("/v1/generate", json={"prompt": "word " * 300}))


# -- messages and types ------------------------------------------------------------------------------------


@pytest.mark.parametrize("path", ["/v1/generate", "/v1/completions"])
@pytest.mark.parametrize(
    ("stop", "message"),
    [
        ([""], "stop: expected a non-empty string or a list of non-empty strings"),
        (7, "stop: expected a non-empty string or a list of non-empty strings"),
        (["x"] * 9, "stop: at most 8 stop sequences"),
    ],
)
def test_a_bad_stop_names_the_field_once(client: TestClient, path: str, stop: Any, message: str) -> None:
    assert error(client.post(path, json={"prompt": "hi", "stop": stop})) == message


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("stream", "yes"),
        ("stream", 1),
        ("echo", "false"),
        ("temperature", "0.5"),
        ("temperature", True),
        ("top_p", "1"),
        ("seed", True),
        ("seed", "1"),
        ("seed", 1.0),
        ("max_tokens", True),
        ("max_tokens", "4"),
        ("n", True),
        ("truncate_prompt", 1),
    ],
)
def test_completions_take_json_types_strictly(client: TestClient, field: str, value: Any) -> None:
    message = error(client.post("/v1/completions", json={"prompt": "hi", "max_tokens": 2, field: value}))
    assert message.startswith(f"{field}: "), message


def test_token_id_prompts_answer_as_their_text_does(client: TestClient) -> None:
    """vLLM's and lm-evaluation-harness's token-id prompts: the ids the server's own tokenizer gives."""
    ids = client.post("/tokenize", json={"model": LM, "prompt": "Acme was founded"}).json()["tokens"]
    body = {"model": LM, "max_tokens": 4, "temperature": 0}
    text = client.post("/v1/completions", json={**body, "prompt": "Acme was founded"}).json()["choices"]
    by_ids = client.post("/v1/completions", json={**body, "prompt": ids}).json()["choices"]
    assert by_ids[0]["text"] == text[0]["text"]
    both = client.post("/v1/completions", json={**body, "prompt": [ids, ids[:2]], "echo": True}).json()
    detokenized = client.post("/detokenize", json={"model": LM, "tokens": ids}).json()["prompt"]
    assert both["choices"][0]["text"] == detokenized + text[0]["text"]  # echoed as the ids spell it


@pytest.mark.parametrize(
    ("prompt", "message"),
    [
        ([1, 2, 10**9], "token ids must be in [0, "),
        ([[1, 2], [-1]], "token ids must be in [0, "),
        ([[1, 2], "text"], "prompt: expected a string, token ids, or a list of either (one kind), got list"),
        ([[]], "prompt: expected a string, token ids, or a list of either (one kind), got list (prompt 0)"),
    ],
)
def test_bad_token_id_prompts_are_clear(client: TestClient, prompt: Any, message: str) -> None:
    assert message in error(client.post("/v1/completions", json={"model": LM, "prompt": prompt}))


@pytest.mark.parametrize(
    ("prompt", "message"),
    [
        ([], "prompt: give a prompt or a list of 1 to 64, not 0"),
        (["a"] * 65, "prompt: give a prompt or a list of 1 to 64, not 65"),
        ("  ", "prompt: the text is empty"),
        ([""], "prompt: the text is empty (prompt 0)"),
        (["a", " "], "prompt: the text is empty (prompt 1)"),
        (
            ["a", None],
            "prompt: expected a string, token ids, or a list of either (one kind), got NoneType (prompt 1)",
        ),
        (None, "prompt: expected a string, token ids, or a list of either (one kind), got NoneType"),
        ({"text": "hi"}, "prompt: expected a string, token ids, or a list of either (one kind), got dict"),
    ],
)
def test_other_bad_completion_prompts(client: TestClient, prompt: Any, message: str) -> None:
    assert error(client.post("/v1/completions", json={"prompt": prompt})) == message


def test_completions_still_take_what_openai_clients_send(client: TestClient) -> None:
    body = {"model": LM, "max_tokens": 3, "temperature": 0, "top_p": 1, "seed": 3, "stream": False}
    for prompt in ("hi", ["hi"]):
        r = client.post("/v1/completions", json={**body, "prompt": prompt, "logprobs": None, "user": "u"})
        assert r.status_code == 200, r.text
        assert r.json()["choices"][0]["finish_reason"] in ("stop", "length")
    streamed = client.post("/v1/completions", json={**body, "prompt": "hi", "stream": True})
    assert streamed.status_code == 200 and streamed.text.endswith("data: [DONE]\n\n")


@pytest.mark.parametrize(("field", "value"), [("best_of", 2), ("suffix", "!")])
def test_openai_knobs_this_server_lacks_are_refused_not_ignored(
    client: TestClient, field: str, value: Any
) -> None:
    message = error(client.post("/v1/completions", json={"prompt": "hi", "max_tokens": 2, field: value}))
    assert message == f"body: not supported by this server: {field}"


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


# -- a stream that fails after it started ---------------------------------------------------------------


class FailsOnThirdCall:
    """The decoder, failing at its third call (a prefill and a decode step stream two tokens first)."""

    def __init__(self, engine: Any) -> None:
        self.engine, self.calls = engine, 0
        self.provider, self.input_names = engine.provider, engine.input_names

    def run(self, feeds: dict[str, Any]) -> dict[str, Any]:
        self.calls += 1
        if self.calls == 3:
            raise EngineError("ONNX Runtime failed: the device fell off the bus")
        return self.engine.run(feeds)


def failing_factory(version: Any, variant: str, settings: Settings) -> Any:
    return FailsOnThirdCall(ort_engine_factory(version, variant, settings))


@pytest.mark.parametrize("path", ["/v1/generate", "/v1/completions"])
def test_a_stream_that_fails_midway_ends_with_an_error_event_and_counts_as_a_failure(
    lm_repository: Path, path: str, caplog: pytest.LogCaptureFixture
) -> None:
    settings = Settings(model_repository=lm_repository, warmup=False, gen_stream_interval_ms=0)
    body: dict[str, Any] = {"stream": True, "ignore_eos": True}
    body |= {"prompt": "The film was", "max_new_tokens": 8}
    if path == "/v1/completions":
        body = {**body, "model": LM, "max_tokens": body.pop("max_new_tokens")}
    with TestClient(create_app(settings, failing_factory)) as client:
        with (
            caplog.at_level(logging.INFO, logger="distilserve.access"),
            client.stream("POST", path, json=body) as r,
        ):
            assert r.status_code == 200  # sent with the first event, before the failure
            events = [line.removeprefix("data: ") for line in r.iter_lines() if line]
        payloads = [json.loads(e) for e in events if e != "[DONE]"]
        tokens = [p for p in payloads if "error" not in p]
        assert len(tokens) == 2, events
        assert all(p.get("finish_reason") is None for p in tokens)
        assert "error" in payloads[-1] and "fell off the bus" in json.dumps(payloads[-1]["error"])
        if path == "/v1/completions":
            assert payloads[-1]["error"]["type"] == "server_error" and events[-1] == "[DONE]"
        metrics = client.get("/metrics").text
        failed = f'distilserve_requests_total{{model="{LM}",status="500",task="text-generation"}} 1.0'
        assert failed in metrics and 'status="200",task="text-generation"' not in metrics
        (line,) = [r for r in caplog.records if r.name == "distilserve.access" and path in r.getMessage()]
        assert "fell off the bus" in line.access["error"]  # type: ignore[attr-defined]
        # the failed sequence left the running batch: the engine serves the next request whole
        again = client.post("/v1/generate", json={"prompt": "The film was", "max_new_tokens": 4})
        assert again.status_code == 200 and again.json()["tokens"] == 4


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
