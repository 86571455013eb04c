"""benchmarks.chat_turns: concurrent multi-turn chats, TTFT by turn, with and without the prefix cache."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from benchmarks.chat_turns import app
from tests.tiny_models import CORPUS, build_tiny_llama


@pytest.fixture(scope="module")
def chat_repository(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from export.pipeline import export_model

    root = tmp_path_factory.mktemp("chat-turns")
    model_dir = build_tiny_llama(root / "hf", positions=1024)  # room for a few turns of byte-level tokens
    result = export_model(model_dir, "text-generation", "chat", root / "repo", ("fp32",))
    assert result.version_dir is not None
    return root / "repo"


def test_each_turn_quotes_the_last_and_the_cache_holds_what_came_before(
    chat_repository: Path, tmp_path: Path
) -> None:
    texts = tmp_path / "texts.txt"
    texts.write_text("\n".join(" ".join(CORPUS[i:] + CORPUS[:i]) for i in range(len(CORPUS))) + "\n")
    args = ["--repository", str(chat_repository), "--model", "chat", "--texts", str(texts), "--chats", "2"]
    args += ["--turns", "3", "--words", "3", "--new-tokens", "4", "--prefix-cache-mb", "0,1", "--rounds", "1"]
    result = CliRunner().invoke(app, [*args, "--out", str(tmp_path / "out")])
    assert result.exit_code == 0, result.output
    servers = json.loads((tmp_path / "out" / "chat-turns-chat.json").read_text())["servers"]
    (off,), (on,) = servers["prefix cache 0 MB"], servers["prefix cache 1 MB"]
    for chats in (off, on):
        for turns in chats:
            prompts = [t["prompt_tokens"] for t in turns]
            assert prompts == sorted(prompts) and prompts[0] < prompts[-1]  # each turn quotes the ones before
    assert all(t["cached_tokens"] == 0 for turns in off for t in turns)
    assert all(turns[-1]["cached_tokens"] > 0 for turns in on)  # the conversation so far, from the cache
    assert (tmp_path / "out" / "chat-turns-chat.png").stat().st_size > 0
    assert "| prefix cache 1 MB | 3 |" in (tmp_path / "out" / "chat-turns-chat.md").read_text()
