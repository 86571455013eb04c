"""OpenAI's /v1/chat/completions on a real uvicorn: the official client, whole and streamed, gives PyTorch's
greedy answer to the prompt transformers' own apply_chat_template renders; bad chat input is a clear 4xx."""

from __future__ import annotations

import json
import logging
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from fastapi.testclient import TestClient

from service.app import create_app
from service.settings import Settings
from tests.conftest import TASK_MODEL_NAMES
from tests.service.generation.test_generate_api import failing_factory
from tests.service.generation.test_logit_shaping import torch_greedy
from tests.service.live_server import LiveServer, live_server

LM = TASK_MODEL_NAMES["text-generation"]  # the tiny GPT-2: no chat template
CHAT = "chat"  # the tiny GQA Llama with a ChatML template
BYTES = "bytes"  # a Llama whose greedy answer is "é" (two byte tokens) over and over
MESSAGES = [
    {"role": "system", "content": "You are brief."},
    {"role": "user", "content": "Who founded Acme?"},
]
NEW_TOKENS = 12


def build_multibyte_llama(out: Path) -> Path:
    """A Llama wired to answer 'ééé…': every layer adds nothing (attention and MLP outputs zeroed), so the
    logits depend on the last token alone; the head maps the prompt's last token and '©' to 'Ã', and 'Ã'
    to '©' — the two byte-level tokens of 'é' (UTF-8 C3 A9), one character split across two tokens."""
    import torch

    from tests.tiny_models import llama_bpe, tiny_llama

    tokenizer = llama_bpe()
    model = tiny_llama(len(tokenizer), tie_word_embeddings=False)
    last = tokenizer.apply_chat_template(MESSAGES, add_generation_prompt=True)[-1]
    first_byte, second_byte = tokenizer.convert_tokens_to_ids(["Ã", "©"])
    with torch.no_grad():
        for layer in model.model.layers:
            layer.self_attn.o_proj.weight.zero_()
            layer.mlp.down_proj.weight.zero_()
        embed, head = model.model.embed_tokens.weight, model.lm_head.weight
        embed.zero_()
        head.zero_()
        for dim, token in enumerate((last, first_byte, second_byte)):
            embed[token, dim] = 1.0
        head[first_byte, 0] = head[first_byte, 2] = 1.0  # after the prompt, or after '©': 'Ã'
        head[second_byte, 1] = 1.0  # after 'Ã': '©'
    model.save_pretrained(out)
    tokenizer.save_pretrained(out)
    return out


@pytest.fixture(scope="module")
def repository(tiny_repository: Path, tiny_llama_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    from export.pipeline import export_model

    root = tmp_path_factory.mktemp("chat")
    repository = root / "repo"
    shutil.copytree(tiny_repository / LM, repository / LM)
    for name, model_dir in ((CHAT, tiny_llama_dir), (BYTES, build_multibyte_llama(root / "bytes-hf"))):
        result = export_model(model_dir, "text-generation", name, repository, ("fp32",))
        assert result.version_dir is not None, [(r.variant, r.problems) for r in result.variants]
    return repository


@pytest.fixture(scope="module")
def server(repository: Path) -> Iterator[LiveServer]:
    with live_server(repository) as s:
        yield s


def openai_client(server: LiveServer) -> Any:
    from openai import OpenAI

    return OpenAI(base_url=f"{server.base_url}/v1", api_key="unused", max_retries=0)


def test_the_export_carries_the_chat_template(repository: Path) -> None:
    from service.repository import read_version

    chat = read_version(repository / CHAT / "1").manifest.chat
    assert chat is not None and "<|im_start|>" in chat.template and chat.eos_token == "<|im_end|>"
    assert read_version(repository / LM / "1").manifest.chat is None


def test_the_model_list_says_which_models_chat(server: LiveServer) -> None:
    listed = httpx.get(f"{server.base_url}/v1/models", timeout=30).json()
    assert {card["name"]: card["chat"] for card in listed["models"]} == {CHAT: True, BYTES: True, LM: False}
    assert {m["id"]: m["chat"] for m in listed["data"]} == {CHAT: True, BYTES: True, LM: False}
    assert all(m["object"] == "model" and m["owned_by"] == "distilserve" for m in listed["data"])
    one = httpx.get(f"{server.base_url}/v1/models/{LM}", timeout=30).json()
    assert one["id"] == LM and one["chat"] is False
    client = openai_client(server)  # OpenAI's list shape still reads, the extra field kept
    assert {m.id: getattr(m, "chat", None) for m in client.models.list()} == {
        CHAT: True,
        BYTES: True,
        LM: False,
    }
    assert getattr(client.models.retrieve(CHAT), "chat", None) is True


def test_the_openai_client_chats_with_pytorchs_greedy_answer(
    server: LiveServer, tiny_llama_dir: Path
) -> None:
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from export.greedy import greedy_torch

    tokenizer = AutoTokenizer.from_pretrained(tiny_llama_dir)
    model = AutoModelForCausalLM.from_pretrained(tiny_llama_dir).eval()
    prompt = tokenizer.apply_chat_template(MESSAGES, add_generation_prompt=True)
    expected = greedy_torch(model, prompt, NEW_TOKENS, tokenizer.eos_token_id)
    text = tokenizer.decode(expected, skip_special_tokens=True, clean_up_tokenization_spaces=False)
    finish = "stop" if expected[-1] == tokenizer.eos_token_id else "length"
    assert len(text) > NEW_TOKENS // 2, text  # a real answer to compare, not an immediate end

    client = openai_client(server)
    plain = client.chat.completions.create(
        model=CHAT, messages=MESSAGES, max_completion_tokens=NEW_TOKENS, temperature=0, user="ignored"
    )
    assert plain.object == "chat.completion" and plain.model == CHAT
    assert plain.choices[0].message.role == "assistant"
    assert plain.choices[0].message.content == text and plain.choices[0].finish_reason == finish
    assert plain.usage is not None
    assert (plain.usage.prompt_tokens, plain.usage.completion_tokens) == (len(prompt), len(expected))
    assert plain.usage.total_tokens == len(prompt) + len(expected)

    chunks = list(
        client.chat.completions.create(
            model=CHAT,
            messages=MESSAGES,
            max_tokens=NEW_TOKENS,  # the older name of the limit
            temperature=0,
            stream=True,
            stream_options={"include_usage": True},
        )
    )
    assert all(c.object == "chat.completion.chunk" for c in chunks)
    assert chunks[0].choices[0].delta.role == "assistant"
    content = [c.choices[0].delta.content or "" for c in chunks if c.choices]
    assert "".join(content) == text
    finishes = [c.choices[0].finish_reason for c in chunks if c.choices]
    assert finishes[-1] == finish and not any(finishes[:-1])
    assert not chunks[-1].choices and chunks[-1].usage is not None
    counts = ("prompt_tokens", "completion_tokens", "total_tokens")
    assert [getattr(chunks[-1].usage, k) for k in counts] == [getattr(plain.usage, k) for k in counts]
    # asked again, its prompt's whole blocks come from the prefix cache (the first time, perhaps not)
    assert (
        chunks[-1].usage.prompt_tokens_details is not None and plain.usage.prompt_tokens_details is not None
    )
    assert 0 < chunks[-1].usage.prompt_tokens_details.cached_tokens < len(prompt)
    assert (
        chunks[-1].usage.prompt_tokens_details.cached_tokens
        >= plain.usage.prompt_tokens_details.cached_tokens
    )


def test_the_openai_clients_penalties_and_logit_bias_give_pytorchs_answer(
    server: LiveServer, tiny_llama_dir: Path
) -> None:
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(tiny_llama_dir)
    model = AutoModelForCausalLM.from_pretrained(tiny_llama_dir).eval()
    prompt = tokenizer.apply_chat_template(MESSAGES, add_generation_prompt=True)
    favoured = tokenizer.convert_tokens_to_ids("Ġfilm")
    shaping = {"presence_penalty": 1.0, "frequency_penalty": 0.5, "logit_bias": ((favoured, 4.0),)}
    expected = torch_greedy(model, prompt, shaping, tokenizer.eos_token_id, NEW_TOKENS)
    assert expected != torch_greedy(model, prompt, {}, tokenizer.eos_token_id, NEW_TOKENS)
    text = tokenizer.decode(expected, skip_special_tokens=True, clean_up_tokenization_spaces=False)

    client = openai_client(server)
    answer = client.chat.completions.create(
        model=CHAT,
        messages=MESSAGES,
        max_completion_tokens=NEW_TOKENS,
        temperature=0,
        presence_penalty=1.0,
        frequency_penalty=0.5,
        logit_bias={str(favoured): 4},
    )
    # the tiny model writes byte tokens: its last character may be incomplete, which a stream holds back
    assert answer.choices[0].message.content == text.rstrip("\ufffd")
    assert answer.usage is not None and answer.usage.completion_tokens == len(expected)
    forced = client.completions.create(
        model=CHAT, prompt="Who", max_tokens=3, temperature=0, logit_bias={str(favoured): 100}
    )
    assert forced.choices[0].text == tokenizer.decode([favoured] * 3)


def test_response_format_gives_json_the_schema_accepts(server: LiveServer) -> None:
    from tests.service.generation.test_grammar import SCHEMA, fits

    client = openai_client(server)
    # the tiny Llama's window is 64 positions, 42 of them the prompt: a short answer
    short = {
        "type": "object",
        "properties": {"ok": {"type": "boolean"}},
        "required": ["ok"],
        "additionalProperties": False,
    }
    schema_format = {"type": "json_schema", "json_schema": {"name": "check", "schema": short, "strict": True}}
    asked: dict[str, Any] = {"model": CHAT, "messages": MESSAGES, "max_completion_tokens": 20}
    answer = client.chat.completions.create(**asked, temperature=0, response_format=schema_format)
    assert answer.choices[0].finish_reason == "stop"
    assert isinstance(json.loads(answer.choices[0].message.content)["ok"], bool)
    sampled = client.chat.completions.create(
        **asked, temperature=1.5, seed=1, n=4, response_format=schema_format
    )
    assert all(isinstance(json.loads(c.message.content)["ok"], bool) for c in sampled.choices)
    streamed = client.chat.completions.create(
        **asked, temperature=0, response_format=schema_format, stream=True
    )
    text = "".join(chunk.choices[0].delta.content or "" for chunk in streamed if chunk.choices)
    assert text == answer.choices[0].message.content
    anything = client.chat.completions.create(**asked, temperature=0, response_format={"type": "json_object"})
    content = anything.choices[0].message.content
    assert content.startswith("{")
    assert anything.choices[0].finish_reason == "length" or isinstance(json.loads(content), dict)
    review = {"type": "json_schema", "json_schema": {"name": "review", "schema": SCHEMA}}
    completion = client.completions.create(
        model=LM, prompt="Acme", max_tokens=40, temperature=0, extra_body={"response_format": review}
    )
    assert fits(completion.choices[0].text) and completion.choices[0].finish_reason == "stop"


def test_the_openai_clients_parse_helper_gets_its_pydantic_model(server: LiveServer) -> None:
    """The official client's `chat.completions.parse(response_format=<a pydantic model>)`: it sends the
    model's strict JSON schema and parses the answer back into the model."""
    from pydantic import BaseModel

    class Check(BaseModel):
        ok: bool

    client = openai_client(server)
    # the tiny Llama has a 64-token window: a short conversation
    short = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Ok?"}]
    answer = client.chat.completions.parse(
        model=CHAT, messages=short, max_completion_tokens=34, temperature=0, response_format=Check
    )
    parsed = answer.choices[0].message.parsed
    assert isinstance(parsed, Check) and answer.choices[0].finish_reason == "stop"


def test_a_character_split_across_tokens_streams_whole(server: LiveServer) -> None:
    client = openai_client(server)
    plain = client.chat.completions.create(model=BYTES, messages=MESSAGES, max_tokens=8, temperature=0)
    assert plain.choices[0].message.content == "éééé" and plain.usage is not None
    assert plain.usage.completion_tokens == 8  # two tokens a character
    stream = client.chat.completions.create(
        model=BYTES, messages=MESSAGES, max_tokens=8, temperature=0, stream=True
    )
    deltas = [c.choices[0].delta.content for c in stream if c.choices and c.choices[0].delta.content]
    assert deltas == ["é"] * 4  # never half a character (a lone byte would be U+FFFD)


def test_content_as_text_parts_is_the_joined_string(server: LiveServer) -> None:
    client = openai_client(server)
    parts = [{"type": "text", "text": "Who founded"}, {"type": "text", "text": "Acme?"}]
    as_parts = client.chat.completions.create(
        model=CHAT, messages=[{"role": "user", "content": parts}], max_tokens=6, temperature=0
    )
    as_string = client.chat.completions.create(
        model=CHAT, messages=[{"role": "user", "content": "Who founded\nAcme?"}], max_tokens=6, temperature=0
    )
    assert as_parts.choices[0].message.content == as_string.choices[0].message.content
    assert as_parts.usage is not None and as_string.usage is not None
    counts = ("prompt_tokens", "completion_tokens", "total_tokens")
    assert [getattr(as_parts.usage, k) for k in counts] == [getattr(as_string.usage, k) for k in counts]


GOOD: dict[str, Any] = {"model": CHAT, "messages": MESSAGES, "max_tokens": 4}


@pytest.mark.parametrize(
    ("change", "status", "message", "param"),
    [
        ({"messages": None}, 400, "messages: Field required", "messages"),
        ({"messages": []}, 400, "messages: List should have at least 1 item", "messages"),
        (
            {"messages": [{"role": "function", "content": "42"}]},
            400,
            "messages.0.role: Input should be",
            "messages.0.role",
        ),
        (
            {"messages": [{"role": "user"}]},
            400,
            "messages.0: content is required",
            "messages.0",
        ),
        (
            {"messages": [{"role": "user", "content": 7}]},
            400,
            "messages.0.content: Input should be a valid string",
            "messages.0.content",
        ),
        (
            {"messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "x"}}]}]},
            400,
            "part 0 is 'image_url': only text parts are supported",
            "messages.0.content",
        ),
        (
            {"messages": [{"role": "assistant", "content": "", "audio": {"id": "a"}}]},
            400,
            "messages.0.audio: Extra inputs are not permitted",
            "messages.0.audio",
        ),
        ({"n": 17}, 400, "n: Input should be less than or equal to 16", "n"),
        ({"tools": [{"type": "function"}]}, 400, "tools.0.function: Field required", "tools.0.function"),
        ({"tool_choice": "auto"}, 400, "tool_choice needs tools", "tool_choice"),
        ({"presence_penalty": 2.5}, 400, "presence_penalty: Input should be less than", "presence_penalty"),
        (
            {
                "response_format": {
                    "type": "json_schema",
                    "json_schema": {"name": "x", "schema": {"type": "no"}},
                }
            },
            400,
            "response_format: the schema cannot be compiled",
            "response_format",
        ),
        (
            {"response_format": {"type": "xml"}},
            400,
            "'xml' is not one of text, json_object",
            "response_format",
        ),
        ({"response_format": {"type": "json_schema"}}, 400, "json_schema needs", "response_format"),
        ({"logit_bias": {"-1": 5}}, 400, "'-1' is not a token id", "logit_bias"),
        ({"temperature": "0"}, 400, "temperature: Input should be a valid number", "temperature"),
        ({"model": LM}, 400, f"model '{LM}' cannot chat: it has no chat template", "model"),
        ({"model": "no-such-model"}, 404, "'no-such-model' is not served", "model"),
    ],
)
def test_bad_chat_input_is_a_clear_4xx_in_openais_shape(
    server: LiveServer, change: dict[str, Any], status: int, message: str, param: str | None
) -> None:
    body = {k: v for k, v in (GOOD | change).items() if v is not None}
    r = httpx.post(f"{server.base_url}/v1/chat/completions", json=body, timeout=30)
    assert r.status_code == status, r.text
    error = r.json()["error"]
    assert message in error["message"] and {"message", "type", "param", "code"} <= set(error)
    assert error["param"] == param
    assert error["type"] == ("invalid_request_error" if status == 400 else "not_found_error")


def test_the_openai_client_reads_the_errors(server: LiveServer) -> None:
    from openai import BadRequestError, NotFoundError

    client = openai_client(server)
    with pytest.raises(BadRequestError, match="cannot chat") as refused:
        client.chat.completions.create(model=LM, messages=MESSAGES)
    assert refused.value.status_code == 400 and refused.value.param == "model"
    assert refused.value.type == "invalid_request_error"
    with pytest.raises(BadRequestError, match="max_tokens: Input should be greater than or equal to 0"):
        client.completions.create(model=LM, prompt="hi", max_tokens=-1)
    with pytest.raises(NotFoundError, match="'nope' is not served"):
        client.chat.completions.create(model="nope", messages=MESSAGES)


def test_a_chat_stream_that_fails_midway_ends_with_an_openai_error_event(
    repository: Path, caplog: pytest.LogCaptureFixture
) -> None:
    settings = Settings(model_repository=repository, warmup=False, gen_stream_interval_ms=0)
    body = {"model": CHAT, "messages": MESSAGES, "max_tokens": 8, "stream": True, "ignore_eos": True}
    with (
        TestClient(create_app(settings, failing_factory)) as client,
        caplog.at_level(logging.INFO, logger="distilserve.access"),
        client.stream("POST", "/v1/chat/completions", json=body) as r,
    ):
        assert r.status_code == 200  # sent with the first event, before the failure
        events = [line.removeprefix("data: ") for line in r.iter_lines() if line]
    payloads = [json.loads(e) for e in events[:-1]]
    assert payloads[0]["choices"][0]["delta"] == {"role": "assistant", "content": ""}
    assert all(p["choices"][0]["finish_reason"] is None for p in payloads[:-1])
    assert (
        payloads[-1]["error"]["type"] == "server_error"
        and "fell off the bus" in payloads[-1]["error"]["message"]
    )
    assert events[-1] == "[DONE]"


def test_auto_tool_calls_are_refused_where_the_parser_is_off(repository: Path) -> None:
    settings = Settings(model_repository=repository, warmup=False, tool_call_parser="off")
    tools = [{"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}]
    body = {"model": CHAT, "messages": MESSAGES, "max_tokens": 40, "tools": tools}
    with TestClient(create_app(settings)) as client:
        refused = client.post("/v1/chat/completions", json=body)
        # the tools listed for the template make the prompt longer than the tiny model's 64-token window
        asked = body | {"tool_choice": "required", "truncate_prompt": True}
        required = client.post("/v1/chat/completions", json=asked)
    assert refused.status_code == 400 and refused.json()["error"]["param"] == "tool_choice"
    assert "DISTILSERVE_TOOL_CALL_PARSER is off" in refused.json()["error"]["message"]
    assert required.status_code == 200, required.text  # a grammar needs no parser
