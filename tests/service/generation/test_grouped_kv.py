"""A Llama-family decoder with grouped-query attention (4 query heads over 2 key/value heads) served by the
generation engine: its cache is sized by the KV heads, and greedy output equals PyTorch's, alone and inside
a running batch that others join."""

from __future__ import annotations

from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest

from service.engine import OrtEngine
from service.generation.sampling import SamplingParams
from service.repository import read_version
from service.tokenization import TextEncoder
from tests.service.generation.helpers import together
from tests.tiny_models import CORPUS

PROMPTS = ["I loved this", "Acme was founded by John Smith in 1950", "Who", "The film was wonderful and"]
NEW_TOKENS = 16


@pytest.fixture(scope="module")
def served(tiny_llama_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Any, ...]]:
    from export.pipeline import export_model

    eval_text = tmp_path_factory.mktemp("gqa-eval") / "eval.txt"
    eval_text.write_text("\n".join(dict.fromkeys(CORPUS)) + "\n", encoding="utf-8")
    repository = tmp_path_factory.mktemp("gqa-repo")
    result = export_model(
        tiny_llama_dir, "text-generation", "llama", repository, ("fp32",), eval_data=eval_text
    )
    assert result.version_dir is not None
    version = read_version(result.version_dir)
    layout = version.manifest.generation
    assert layout is not None and layout.num_key_value_heads < layout.num_heads
    encoder = TextEncoder(version.file(version.manifest.tokenizer.file), version.manifest.tokenizer)
    with ThreadPoolExecutor(max_workers=1) as executor:
        yield OrtEngine(version.file("model.onnx"), device="cpu"), layout, encoder, executor


def generate_together(served: tuple[Any, ...], prompts: list[list[int]]) -> list[list[int]]:
    return together(served, prompts, SamplingParams(max_new_tokens=NEW_TOKENS))


def test_greedy_with_grouped_kv_heads_equals_pytorch_alone_and_in_a_batch(
    served: tuple[Any, ...], tiny_llama_dir: Path
) -> None:
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from export.greedy import greedy_torch

    model = AutoModelForCausalLM.from_pretrained(tiny_llama_dir).eval()
    tokenizer = AutoTokenizer.from_pretrained(tiny_llama_dir)
    prompts = [tokenizer(text)["input_ids"] for text in PROMPTS]
    eos = served[1].eos_token_id
    expected = [greedy_torch(model, p, NEW_TOKENS, eos) for p in prompts]
    assert [generate_together(served, [p])[0] for p in prompts] == expected
    assert generate_together(served, prompts) == expected
