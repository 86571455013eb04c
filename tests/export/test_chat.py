"""export.chat: the template a manifest carries, and adding it to a version exported without one."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from export.chat import add_chat_template, chat_spec
from service.repository import read_version
from tests.conftest import TASK_MODEL_NAMES
from tests.tiny_models import CHAT_TEMPLATE, llama_bpe

LM = TASK_MODEL_NAMES["text-generation"]


def test_chat_spec_takes_the_template_and_its_tokens() -> None:
    spec = chat_spec(llama_bpe())
    assert spec is not None and spec.template == CHAT_TEMPLATE
    assert (spec.bos_token, spec.eos_token) == ("<|im_start|>", "<|im_end|>")
    tokenizer = llama_bpe()
    tokenizer.chat_template = {"default": "{{ messages }}", "tool_use": "{{ tools }}"}
    assert chat_spec(tokenizer) is not None and chat_spec(tokenizer).template == "{{ messages }}"  # type: ignore[union-attr]
    tokenizer.chat_template = None
    assert chat_spec(tokenizer) is None


def test_a_template_is_added_to_an_existing_version_from_its_own_hf_directory(
    tiny_repository: Path, tiny_models: dict[str, Path], tiny_llama_dir: Path, tmp_path: Path
) -> None:
    version_dir = tmp_path / LM / "1"
    shutil.copytree(tiny_repository / LM / "1", version_dir)
    assert read_version(version_dir).manifest.chat is None
    hf_dir = tmp_path / "hf"
    shutil.copytree(tiny_models["text-generation"], hf_dir)
    with pytest.raises(ValueError, match="has no chat template"):
        add_chat_template(hf_dir, version_dir)
    with pytest.raises(ValueError, match="is not the tokenizer"):  # another model's template
        add_chat_template(tiny_llama_dir, version_dir)
    (hf_dir / "chat_template.jinja").write_text(CHAT_TEMPLATE, encoding="utf-8")  # tokenizer.json unchanged
    spec = add_chat_template(hf_dir, version_dir)
    manifest = read_version(version_dir).manifest  # still valid, checksums included
    assert manifest.chat == spec and spec.template == CHAT_TEMPLATE
    assert not list(version_dir.glob(".*"))  # no staging file left behind
