"""OpenAI's `logprobs` on a real uvicorn (the engine core in its own process): each token's log-probability
is PyTorch's log-softmax of the model's logits at that position, in the chat and the legacy completions
shapes, whole and streamed alike; a token inside a character reports its bytes; bad requests are 400s."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest

from export.greedy import greedy_torch
from service.tokenization import _byte_level_bytes
from tests.service.live_server import LiveServer, live_server
from tests.service.tasks.test_openai_generation import BYTES, CHAT, MESSAGES, openai_client
from tests.service.tasks.test_openai_generation import repository as repository  # the module's fixture

NEW_TOKENS = 10


@pytest.fixture(scope="module")
def server(repository: Path) -> Iterator[LiveServer]:
    with live_server(repository) as s:
        yield s


@pytest.fixture(scope="module")
def reference(tiny_llama_dir: Path) -> tuple[Any, Any]:
    from transformers import AutoModelForCausalLM, AutoTokenizer

    return AutoModelForCausalLM.from_pretrained(tiny_llama_dir).eval(), AutoTokenizer.from_pretrained(
        tiny_llama_dir
    )


def torch_logprobs(model: Any, prompt: list[int], tokens: list[int]) -> np.ndarray:
    """[len(tokens), vocab]: the model's log-softmax at the positions that chose each token."""
    import torch

    with torch.no_grad():
        logits = model(torch.tensor([prompt + tokens])).logits[
            0, len(prompt) - 1 : len(prompt) - 1 + len(tokens)
        ]
    return torch.log_softmax(logits.double(), dim=-1).numpy()


def chat_prompt(tokenizer: Any) -> list[int]:
    return list(tokenizer.apply_chat_template(MESSAGES, add_generation_prompt=True))


def test_chat_logprobs_are_pytorchs_whole_and_streamed(
    server: LiveServer, reference: tuple[Any, Any]
) -> None:
    model, tokenizer = reference
    client = openai_client(server)
    ask: dict[str, Any] = {"model": CHAT, "messages": MESSAGES, "max_tokens": NEW_TOKENS, "temperature": 0}
    plain = client.chat.completions.create(**ask, logprobs=True, top_logprobs=3)
    content = plain.choices[0].logprobs.content
    assert plain.usage is not None and len(content) == plain.usage.completion_tokens

    prompt = chat_prompt(tokenizer)
    expected = greedy_torch(model, prompt, NEW_TOKENS, tokenizer.eos_token_id)
    reference_lp = torch_logprobs(model, prompt, expected)
    assert len(content) == len(expected)
    for entry, token, row in zip(content, expected, reference_lp, strict=True):
        assert entry.logprob == pytest.approx(row[token], abs=1e-4)
        top = [t.logprob for t in entry.top_logprobs]
        assert len(top) == 3 and top == sorted(top, reverse=True)
        assert top == pytest.approx(sorted(row, reverse=True)[:3], abs=1e-4)
        assert entry.top_logprobs[0].token == entry.token  # greedy: the chosen token is the most likely
    text_tokens = [e for e, t in zip(content, expected, strict=True) if t != tokenizer.eos_token_id]
    assert b"".join(bytes(e.bytes) for e in text_tokens).decode() == plain.choices[0].message.content

    streamed = [
        entry
        for chunk in client.chat.completions.create(**ask, logprobs=True, top_logprobs=3, stream=True)
        if chunk.choices and chunk.choices[0].logprobs is not None
        for entry in chunk.choices[0].logprobs.content
    ]
    # the same tokens; their numbers equal up to float rounding: the second request's prompt begins with
    # the first's cached blocks (the prefix cache), run in another call shape
    assert [(e.token, e.bytes, [t.token for t in e.top_logprobs]) for e in streamed] == [
        (e.token, e.bytes, [t.token for t in e.top_logprobs]) for e in content
    ]
    for got, want in zip(streamed, content, strict=True):
        assert got.logprob == pytest.approx(want.logprob, abs=1e-5)
        assert [t.logprob for t in got.top_logprobs] == pytest.approx(
            [t.logprob for t in want.top_logprobs], abs=1e-5
        )
    without = client.chat.completions.create(**ask)
    assert without.choices[0].logprobs is None
    assert without.choices[0].message.content == plain.choices[0].message.content


def test_completion_logprobs_in_openais_legacy_shape(server: LiveServer, reference: tuple[Any, Any]) -> None:
    model, tokenizer = reference
    prompt_text = "Acme was founded"
    body = {"model": CHAT, "prompt": prompt_text, "max_tokens": NEW_TOKENS, "temperature": 0, "logprobs": 2}
    whole = httpx.post(f"{server.base_url}/v1/completions", json=body, timeout=60).json()
    choice = whole["choices"][0]
    logprobs = choice["logprobs"]
    prompt = tokenizer(prompt_text)["input_ids"]
    expected = torch_logprobs(model, prompt, tokenizer(choice["text"], add_special_tokens=False)["input_ids"])
    n = len(logprobs["tokens"])
    assert (
        n
        == whole["usage"]["completion_tokens"]
        == len(logprobs["token_logprobs"])
        == len(logprobs["top_logprobs"])
    )
    for i in range(min(n, len(expected))):
        assert logprobs["token_logprobs"][i] == pytest.approx(expected[i].max(), abs=1e-4)  # greedy
        top = logprobs["top_logprobs"][i]
        assert logprobs["tokens"][i] in top and 1 <= len(top) <= 3  # the 2 best and the chosen one
    offsets = logprobs["text_offset"]
    assert offsets[0] == 0 and offsets == sorted(offsets)
    for token, offset in zip(logprobs["tokens"], offsets, strict=True):
        if not token.startswith("bytes:") and choice["text"][offset:]:
            assert choice["text"][offset:].startswith(token)

    with httpx.stream(
        "POST", f"{server.base_url}/v1/completions", json={**body, "stream": True}, timeout=60
    ) as r:
        events = [json.loads(line[6:]) for line in r.iter_lines() if line.startswith("data: {")]
    pieces = [e["choices"][0]["logprobs"] for e in events if e["choices"][0]["logprobs"]]
    joined = {key: [v for p in pieces for v in p[key]] for key in logprobs}
    assert joined == logprobs
    assert "".join(e["choices"][0]["text"] for e in events) == choice["text"]


def test_a_sampled_tokens_logprob_is_under_the_models_own_distribution(
    server: LiveServer, reference: tuple[Any, Any]
) -> None:
    model, tokenizer = reference
    client = openai_client(server)
    sampled = client.chat.completions.create(
        model=CHAT,
        messages=MESSAGES,
        max_tokens=NEW_TOKENS,
        temperature=1.7,
        top_p=0.9,
        seed=11,
        logprobs=True,
    )
    content = sampled.choices[0].logprobs.content
    stand_in = {byte: char for char, byte in _byte_level_bytes().items()}  # the tokenizer is byte-level
    ids = [tokenizer.convert_tokens_to_ids("".join(stand_in[b] for b in entry.bytes)) for entry in content]
    assert ids and None not in ids
    row = torch_logprobs(model, chat_prompt(tokenizer), ids)
    for entry, token, logprobs in zip(content, ids, row, strict=True):
        assert entry.logprob == pytest.approx(logprobs[token], abs=1e-4)  # not the temperature's
        assert entry.top_logprobs == []


def test_a_token_inside_a_character_reports_its_bytes(server: LiveServer) -> None:
    client = openai_client(server)
    ask: dict[str, Any] = {"model": BYTES, "messages": MESSAGES, "max_tokens": 4, "temperature": 0}
    plain = client.chat.completions.create(**ask, logprobs=True)
    content = plain.choices[0].logprobs.content
    assert plain.choices[0].message.content == "éé"
    assert [(e.token, e.bytes) for e in content] == [("bytes:\\xc3", [0xC3]), ("bytes:\\xa9", [0xA9])] * 2
    chunks = [
        c.choices[0]
        for c in client.chat.completions.create(**ask, logprobs=True, stream=True)
        if c.choices and c.choices[0].delta.content
    ]
    assert [c.delta.content for c in chunks] == ["é", "é"]  # never half a character, and
    assert [len(c.logprobs.content) for c in chunks] == [2, 2]  # each chunk brings both its tokens


def test_echo_scores_the_prompt_as_pytorch_does(server: LiveServer, reference: tuple[Any, Any]) -> None:
    """lm-evaluation-harness's loglikelihood request: the prompt echoed with its tokens' log-probabilities."""
    model, tokenizer = reference
    text = "Acme was founded in a garage, and it grew"
    body = {"model": CHAT, "prompt": text, "max_tokens": 1, "temperature": 0, "echo": True, "logprobs": 1}
    whole = httpx.post(f"{server.base_url}/v1/completions", json=body, timeout=60).json()
    choice, prompt = whole["choices"][0], tokenizer(text)["input_ids"]
    logprobs = choice["logprobs"]
    assert choice["text"].startswith(text) and len(logprobs["tokens"]) == len(prompt) + 1
    assert logprobs["token_logprobs"][0] is None and logprobs["top_logprobs"][0] is None
    expected = torch_logprobs(model, prompt[:1], prompt[1:])  # each prompt token under the ones before it
    scores = [row[token] for row, token in zip(expected, prompt[1:], strict=True)]
    assert logprobs["token_logprobs"][1 : len(prompt)] == pytest.approx(scores, abs=1e-4)
    assert all(
        t in top and len(top) <= 2
        for t, top in zip(logprobs["tokens"][1:], logprobs["top_logprobs"][1:], strict=True)
    )
    for token, offset in zip(logprobs["tokens"], logprobs["text_offset"], strict=True):
        assert choice["text"][offset:].startswith(token)
    assert logprobs["text_offset"][len(prompt)] == len(text)  # the generated token starts after the prompt

    with httpx.stream(
        "POST", f"{server.base_url}/v1/completions", json={**body, "stream": True}, timeout=60
    ) as r:
        events = [json.loads(line[6:]) for line in r.iter_lines() if line.startswith("data: {")]
    assert "".join(e["choices"][0]["text"] for e in events) == choice["text"]
    pieces = [e["choices"][0]["logprobs"] for e in events if e["choices"][0]["logprobs"]]
    assert {key: [v for p in pieces for v in p[key]] for key in logprobs} == logprobs

    plain = httpx.post(
        f"{server.base_url}/v1/completions", json={**body, "logprobs": None}, timeout=60
    ).json()
    assert plain["choices"][0]["text"] == choice["text"] and plain["choices"][0]["logprobs"] is None


@pytest.mark.parametrize(
    ("path", "change", "message"),
    [
        ("chat/completions", {"top_logprobs": 2}, "top_logprobs needs logprobs: true"),
        ("chat/completions", {"logprobs": True, "top_logprobs": 21}, "less than or equal to 20"),
        ("chat/completions", {"logprobs": 1}, "logprobs: Input should be a valid boolean"),
        ("completions", {"logprobs": 6}, "logprobs: Input should be less than or equal to 5"),
        ("completions", {"logprobs": -1}, "logprobs: Input should be greater than or equal to 0"),
        ("completions", {"echo": True, "logprobs": 1, "suffix": "!"}, "not supported by this server: suffix"),
    ],
)
def test_bad_logprobs_requests_are_400s(
    server: LiveServer, path: str, change: dict[str, Any], message: str
) -> None:
    body = {"model": CHAT, "max_tokens": 2} | (
        {"messages": MESSAGES} if path.startswith("chat") else {"prompt": "hi"}
    )
    r = httpx.post(f"{server.base_url}/v1/{path}", json=body | change, timeout=30)
    assert r.status_code == 400 and message in r.json()["error"]["message"], r.text


def test_lm_evaluation_harness_loglikelihood_flow(server: LiveServer, reference: tuple[Any, Any]) -> None:
    """What lm-evaluation-harness's `local-completions` does for `loglikelihood`, step by step: its remote
    tokenizer (GET /tokenizer_info, POST /tokenize), then token-id prompts of context + continuation with
    `echo`, `logprobs: 1`, `max_tokens: 1`, parsed as it parses them; the scores are PyTorch's."""
    model, _ = reference
    base = server.base_url
    assert "eos_token" in httpx.get(f"{base}/tokenizer_info", params={"model": CHAT}, timeout=30).json()
    pairs = [("Acme was founded", " by John Smith"), ("I loved this", " film, it was wonderful")]

    def ids(text: str) -> list[int]:
        body = {"model": CHAT, "prompt": text, "add_special_tokens": False}
        return httpx.post(f"{base}/tokenize", json=body, timeout=30).json()["tokens"]

    requests = [(ids(context), ids(continuation)) for context, continuation in pairs]
    payload = {"model": CHAT, "prompt": [c + t for c, t in requests], "temperature": 0, "max_tokens": 1}
    out = httpx.post(
        f"{base}/v1/completions", json=payload | {"logprobs": 1, "echo": True, "seed": 1234}
    ).json()
    for choice, (context, continuation) in zip(
        sorted(out["choices"], key=lambda c: c["index"]), requests, strict=True
    ):
        ctxlen = len(context)
        scores = choice["logprobs"]["token_logprobs"][ctxlen:-1]
        tops = choice["logprobs"]["top_logprobs"][ctxlen:-1]
        is_greedy = all(score == max(top.values()) for score, top in zip(scores, tops, strict=True))
        expected = torch_logprobs(model, context, continuation)
        reference_scores = [row[t] for row, t in zip(expected, continuation, strict=True)]
        assert sum(scores) == pytest.approx(sum(reference_scores), abs=1e-3)
        greedy = all(row.argmax() == t for row, t in zip(expected, continuation, strict=True))
        assert is_greedy == greedy


def test_max_tokens_0_with_echo_scores_the_prompt_alone(server: LiveServer) -> None:
    body = {
        "model": CHAT,
        "prompt": ["Acme was founded", "Who"],
        "max_tokens": 0,
        "echo": True,
        "logprobs": 0,
    }
    whole = httpx.post(f"{server.base_url}/v1/completions", json=body, timeout=60).json()
    with_one = httpx.post(
        f"{server.base_url}/v1/completions", json={**body, "max_tokens": 1}, timeout=60
    ).json()
    for choice, longer, text in zip(whole["choices"], with_one["choices"], body["prompt"], strict=True):
        assert choice["text"] == text and choice["finish_reason"] == "length"
        assert {k: v[:-1] for k, v in longer["logprobs"].items()} == choice[
            "logprobs"
        ]  # the prompt's entries
    assert whole["usage"]["completion_tokens"] == 0
    assert whole["usage"]["prompt_tokens"] == with_one["usage"]["prompt_tokens"]
    with httpx.stream(
        "POST", f"{server.base_url}/v1/completions", json={**body, "stream": True}, timeout=60
    ) as r:
        events = [json.loads(line[6:]) for line in r.iter_lines() if line.startswith("data: {")]
    texts = {
        i: "".join(e["choices"][0]["text"] for e in events if e["choices"][0]["index"] == i) for i in (0, 1)
    }
    assert texts == {0: "Acme was founded", 1: "Who"}
    refused = httpx.post(f"{server.base_url}/v1/completions", json={**body, "echo": False}, timeout=30)
    assert refused.status_code == 400 and "max_tokens 0 needs echo" in refused.json()["error"]["message"]
