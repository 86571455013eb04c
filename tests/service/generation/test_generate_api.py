"""/v1/generate and /v1/completions over HTTP on the tiny GPT-2: bad input is a clear 422 (400 on OpenAI's
route), never a 500."""

from __future__ import annotations

import json
import logging
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
from tests.service.generation.helpers import error

LM = TASK_MODEL_NAMES["text-generation"]
BUDGET = 16  # cached tokens one request may reserve: far below the tiny model's 64-token window


@pytest.fixture(scope="module")
def small_budget(lm_repository: Path) -> Iterator[TestClient]:
    settings = Settings(model_repository=lm_repository, gen_max_cached_tokens=BUDGET)
    with TestClient(create_app(settings)) as c:
        yield c


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
