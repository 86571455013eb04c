"""Several stop tokens: a model whose generation config lists two eos ids stops at either, from export
(the manifest carries both) to the engine (generation ends at the second one)."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from fastapi.testclient import TestClient

from service.app import create_app
from service.manifest import GenerationLayout
from service.settings import Settings

PROMPT = "Who founded Acme?"
EOS = 2  # the tiny Llama's <|im_end|>


def test_an_older_manifest_stops_at_its_eos_alone() -> None:
    layout = GenerationLayout.model_validate_json(
        '{"num_layers": 1, "num_heads": 1, "head_dim": 8, "eos_token_id": 5}'
    )
    assert layout.stop_token_ids == [] and layout.stop_ids() == {5}
    both = layout.model_copy(update={"stop_token_ids": [5, 9]})
    assert both.stop_ids() == {5, 9}


def test_export_gathers_the_stop_ids_of_tokenizer_generation_config_and_chat_template() -> None:
    from export.tasks import stop_token_ids

    vocab = {"<eos>": 0, "<|eot_id|>": 7, "<unk>": 3}
    tokenizer = SimpleNamespace(
        eos_token_id=0, unk_token_id=3, convert_tokens_to_ids=lambda t: vocab.get(t, 3)
    )
    config = SimpleNamespace(eos_token_id=0)
    generation_config = SimpleNamespace(eos_token_id=[0, 7, 8])
    assert stop_token_ids(config, tokenizer, generation_config) == [0, 7, 8]
    assert stop_token_ids(config, tokenizer, None, "<|eot_id|>") == [0, 7]
    assert stop_token_ids(config, tokenizer, None, "<nowhere>") == [0]  # unknown: not the unk id


def greedy_ids(model: Any, prompt: list[int], n: int) -> list[int]:
    """PyTorch's greedy tokens with no stop at all."""
    import torch

    ids, out = torch.tensor([prompt]), []
    with torch.no_grad():
        for _ in range(n):
            token = int(model(ids).logits[0, -1].argmax())
            out.append(token)
            ids = torch.cat([ids, torch.tensor([[token]])], dim=1)
    return out


@pytest.fixture(scope="module")
def exported(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, list[int], int]:
    """A tiny Llama (weights drawn wide, so its greedy tokens differ) whose generation config ends at its
    eos and at the fourth token it would generate; exported. -> (repository, greedy tokens, second stop)."""
    from export.pipeline import export_model
    from tests.tiny_models import llama_bpe, tiny_llama

    root = tmp_path_factory.mktemp("stops")
    tokenizer = llama_bpe()
    model = tiny_llama(len(tokenizer), std=0.3)
    greedy = greedy_ids(model, tokenizer(PROMPT)["input_ids"], 8)
    second = greedy[3]
    assert second != EOS and second not in greedy[:3], greedy  # it stops there, not before
    model.generation_config.eos_token_id = [EOS, second]
    model.save_pretrained(root / "hf")
    tokenizer.save_pretrained(root / "hf")
    assert json.loads((root / "hf" / "generation_config.json").read_text())["eos_token_id"] == [EOS, second]
    result = export_model(root / "hf", "text-generation", "stops", root / "repo", ("fp32",))
    assert result.version_dir is not None, [(r.variant, r.problems) for r in result.variants]
    return root / "repo", greedy, second


@pytest.fixture(scope="module")
def client(exported: tuple[Path, list[int], int]) -> Iterator[TestClient]:
    with TestClient(create_app(Settings(model_repository=exported[0], warmup=False))) as c:
        yield c


def test_the_manifest_carries_both_eos_ids(exported: tuple[Path, list[int], int]) -> None:
    from service.repository import read_version

    repository, _, second = exported
    layout = read_version(repository / "stops" / "1").manifest.generation
    assert layout is not None
    assert layout.eos_token_id == EOS and layout.stop_token_ids == [EOS, second]


def test_generation_stops_at_the_second_eos(client: TestClient) -> None:
    body = {"prompt": PROMPT, "max_new_tokens": 8, "model": "stops"}
    stopped = client.post("/v1/generate", json=body).json()
    assert (stopped["tokens"], stopped["finish_reason"]) == (4, "eos"), stopped  # three tokens, then the stop
    going_on = client.post("/v1/generate", json={**body, "ignore_eos": True}).json()
    assert (going_on["tokens"], going_on["finish_reason"]) == (8, "length"), going_on
    assert going_on["generated_text"].startswith(stopped["generated_text"])
    completion = client.post(
        "/v1/completions", json={"prompt": PROMPT, "max_tokens": 8, "temperature": 0, "model": "stops"}
    )
    assert completion.json()["choices"][0]["finish_reason"] == "stop"
    assert completion.json()["usage"]["completion_tokens"] == 4
