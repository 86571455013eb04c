"""vLLM's tokenizer routes (/tokenize with `prompt`, /detokenize, /tokenizer_info) beside TEI's /tokenize:
the ids are the model's own tokenizer's, detokenizing gives the text back, the info names the special tokens
and the chat template, and a server whose models share one tokenizer needs no model named (what
lm-evaluation-harness's remote tokenizer sends)."""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient

from service.app import create_app
from service.settings import Settings
from tests.service.test_tei import LM, TEXT
from tests.service.test_tei import client as client  # the tiny repository's app, one per module


@pytest.fixture(scope="module")
def shared(tiny_repository: Path, tiny_llama_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Two Llamas with one tokenizer (a teacher and its student's case)."""
    from export.pipeline import export_model

    repository = tmp_path_factory.mktemp("shared") / "models"
    for name in ("llama", "llama-copy"):
        assert export_model(tiny_llama_dir, "text-generation", name, repository, ("fp32",)).version_dir
    return repository


def test_prompt_tokens_are_the_tokenizers_and_detokenize_back(client: TestClient, tiny_models: Any) -> None:
    from transformers import AutoTokenizer

    expected = AutoTokenizer.from_pretrained(tiny_models["text-generation"])(TEXT)["input_ids"]
    r = client.post("/tokenize", json={"model": LM, "prompt": TEXT})
    assert r.status_code == 200, r.text
    assert r.json() == {"count": len(expected), "max_model_len": 64, "tokens": expected}
    back = client.post("/detokenize", json={"model": LM, "tokens": expected})
    assert back.status_code == 200 and back.json() == {"prompt": TEXT}
    tei = client.post("/tokenize", json={"model": LM, "inputs": TEXT}).json()  # TEI's shape, same path
    assert [t["id"] for t in tei[0]] == expected


def test_tokenizer_info_names_the_special_tokens_and_template(shared: Path, tiny_llama_dir: Path) -> None:
    from transformers import AutoTokenizer

    hf = AutoTokenizer.from_pretrained(tiny_llama_dir)
    with TestClient(create_app(Settings(model_repository=shared))) as client:
        info = client.get("/tokenizer_info").json()  # two models, one tokenizer: no name needed
        assert info["eos_token"] == hf.eos_token == "<|im_end|>" and info["chat_template"] == hf.chat_template
        assert info["vocab_size"] == len(hf) and info["model_max_length"] > 0
        ids = client.post(
            "/tokenize", json={"prompt": "Who founded Acme?", "add_special_tokens": False}
        ).json()
        assert ids["tokens"] == hf("Who founded Acme?", add_special_tokens=False)["input_ids"]
        assert (
            client.post("/detokenize", json={"tokens": ids["tokens"]}).json()["prompt"] == "Who founded Acme?"
        )


@pytest.mark.parametrize(
    ("method", "path", "body", "status", "message"),
    [
        ("post", "/tokenize", {"prompt": TEXT}, 422, "models with different tokenizers are served"),
        ("get", "/tokenizer_info", None, 422, "name one in `model`"),
        ("post", "/tokenize", {"model": LM, "prompt": 7}, 422, "Input should be a valid string"),
        ("post", "/detokenize", {"model": LM, "tokens": [10**9]}, 422, "below the vocabulary's"),
        ("post", "/detokenize", {"model": LM, "tokens": [-1]}, 422, "greater than or equal to 0"),
        ("post", "/detokenize", {"model": "nope", "tokens": [1]}, 404, "'nope' is not served"),
    ],
)
def test_mistakes_are_clear_4xx(
    client: TestClient, method: str, path: str, body: Any, status: int, message: str
) -> None:
    r = client.post(path, json=body) if method == "post" else client.get(path)
    assert r.status_code == status and message in r.text, r.text


def test_the_only_model_needs_no_name(tiny_repository: Path, tmp_path: Path) -> None:
    shutil.copytree(tiny_repository / LM, tmp_path / "models" / LM)
    with TestClient(create_app(Settings(model_repository=tmp_path / "models"))) as client:
        assert client.post("/tokenize", json={"prompt": TEXT}).json()["count"] > 0
