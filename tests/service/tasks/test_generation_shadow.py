"""Live agreement for generation students: with DISTILSERVE_SHADOW_RATE, each finished answer of a student is
read back by its teacher off the client's path, and every token counts as agreed where it is the teacher's
most likely next token, as PyTorch's teacher says; a teacher checking itself agrees on every token."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from fastapi.testclient import TestClient

from service.app import create_app
from service.settings import Settings
from tests.service.test_app import metric_value
from tests.tiny_models import export_lm_pair


@pytest.fixture(scope="module")
def pairs(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """`lm-teacher`; `lm`, a student of another seed; `lm-self`, the teacher exported as its own student."""
    return export_lm_pair(tmp_path_factory.mktemp("gen-shadow"), self_student="lm-self")


@pytest.fixture(scope="module")
def client(pairs: tuple[Path, Path]) -> Iterator[TestClient]:
    settings = Settings(model_repository=pairs[0], shadow_rate=1.0, speculative="off")
    with TestClient(create_app(settings)) as c:
        yield c


def counted(client: TestClient, model: str, at_least: float) -> tuple[float, float]:
    """(compared, agreed) once the checks in flight have landed."""
    deadline = time.monotonic() + 20
    while True:
        text = client.get("/metrics").text
        compared = metric_value(text, "distilserve_shadow_compared_total", model=model, teacher="lm-teacher")
        if compared >= at_least or time.monotonic() > deadline:
            agreed = metric_value(text, "distilserve_shadow_agreed_total", model=model, teacher="lm-teacher")
            return compared, agreed
        time.sleep(0.05)


def generated_ids(client: TestClient, model: str, prompt: str, tokens: int) -> list[int]:
    body = {"model": model, "prompt": prompt, "max_new_tokens": tokens, "stream": True, "ignore_eos": True}
    with client.stream("POST", "/v1/generate", json=body) as r:
        events = [json.loads(line[6:]) for line in r.iter_lines() if line.startswith("data: {")]
    return [e["token"] for e in events if "token" in e]


def test_a_teacher_checking_itself_agrees_on_every_token(client: TestClient) -> None:
    before, _ = counted(client, "lm-self", 0)
    body = {"model": "lm-self", "prompt": "Acme was founded", "max_tokens": 12, "temperature": 0}
    answer = client.post("/v1/completions", json=body | {"ignore_eos": True}).json()
    assert answer["usage"]["completion_tokens"] == 12
    compared, agreed = counted(client, "lm-self", before + 12)
    assert compared - before == 12 and agreed == compared


def test_a_students_tokens_agree_where_pytorchs_teacher_would_write_them(
    client: TestClient, pairs: tuple[Path, Path]
) -> None:
    import torch
    from transformers import AutoModelForCausalLM

    teacher = AutoModelForCausalLM.from_pretrained(pairs[1]).eval()
    before, agreed_before = counted(client, "lm", 0)
    prompt = "I loved this film"
    output = generated_ids(client, "lm", prompt, 16)
    compared, agreed = counted(client, "lm", before + 16)
    assert compared - before == 16
    prompt_ids = client.post("/tokenize", json={"model": "lm", "prompt": prompt}).json()["tokens"]
    with torch.no_grad():
        logits = teacher(torch.tensor([prompt_ids + output])).logits[0]
    best = logits[len(prompt_ids) - 1 : -1].argmax(-1).tolist()
    assert agreed - agreed_before == sum(b == t for b, t in zip(best, output, strict=True))
    assert 0 < agreed - agreed_before < 16  # another seed: a real measurement, neither all nor nothing


def test_sampled_or_penalised_answers_are_not_checked(client: TestClient) -> None:
    before = counted(client, "lm", 0)
    for extra in ({"temperature": 1.0, "seed": 3}, {"repetition_penalty": 1.3}):
        body = {"model": "lm", "prompt": "Who", "max_tokens": 6, "ignore_eos": True} | extra
        assert client.post("/v1/completions", json=body).status_code == 200
    greedy = {"model": "lm", "prompt": "Who", "max_tokens": 6, "ignore_eos": True, "temperature": 0}
    assert client.post("/v1/completions", json=greedy).status_code == 200  # the one counted, after the others
    assert counted(client, "lm", before[0] + 6)[0] == before[0] + 6


def test_no_rate_no_checks(pairs: tuple[Path, Path]) -> None:
    with TestClient(create_app(Settings(model_repository=pairs[0], speculative="off"))) as client:
        client.post("/v1/completions", json={"model": "lm", "prompt": "Who", "max_tokens": 4})
        time.sleep(0.2)
        assert counted(client, "lm", 0) == (0, 0)
