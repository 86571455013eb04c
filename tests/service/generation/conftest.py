"""Fixtures of the generation tests: a tiny teacher/student pair exported as the service serves them, and an
app serving the tiny language model alone (`client`)."""

from __future__ import annotations

import shutil
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient

from service.app import create_app
from service.engine import Engine, OrtEngine
from service.manifest import GenerationLayout
from service.repository import read_version, scan_repository
from service.runtime import ort_engine_factory
from service.settings import Settings
from service.tokenization import TextEncoder
from tests.conftest import TASK_MODEL_NAMES
from tests.tiny_models import export_lm_pair


@pytest.fixture(scope="module")
def lm_pair(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A tiny GPT-2 teacher (`lm-teacher`) and a student of another seed paired with it (`lm`)."""
    return export_lm_pair(tmp_path_factory.mktemp("lm-pair"))[0]


GRAPHS = {"appending": ("tiny_repository", "new"), "optimum": ("optimum_lm_repository", "all")}


@pytest.fixture(scope="module", params=list(GRAPHS))
def parts(request: pytest.FixtureRequest) -> Iterator[tuple[Any, ...]]:
    """Every test runs on both decoder graphs: distilserve's appending one and optimum's."""
    repository, present_positions = GRAPHS[request.param]
    version = read_version(request.getfixturevalue(repository) / TASK_MODEL_NAMES["text-generation"] / "1")
    m = version.manifest
    assert m.generation is not None
    assert m.generation.present_positions == present_positions
    engine = OrtEngine(version.file("model.onnx"), device="cpu")
    encoder = TextEncoder(version.file(m.tokenizer.file), m.tokenizer)
    with ThreadPoolExecutor(max_workers=1) as executor:
        yield engine, m.generation, encoder, executor


Loaded = dict[str, tuple[Engine, GenerationLayout]]


@pytest.fixture(scope="module")
def loaded(lm_pair: Path) -> Loaded:
    """Both models of the tiny pair, each an fp32 session and its generation layout, by name."""
    versions = {v.manifest.name: v for v in scan_repository(lm_pair).versions}
    out: Loaded = {}
    for name, version in versions.items():
        assert version.manifest.generation is not None
        out[name] = (ort_engine_factory(version, "fp32", Settings()), version.manifest.generation)
    return out


@pytest.fixture(scope="module")
def lm_repository(tmp_path_factory: pytest.TempPathFactory, tiny_repository: Path) -> Path:
    """The tiny repository's language model alone: the apps here need nothing else."""
    repository = tmp_path_factory.mktemp("lm-only")
    name = TASK_MODEL_NAMES["text-generation"]
    shutil.copytree(tiny_repository / name, repository / name)
    return repository


@pytest.fixture(scope="module")
def client(lm_repository: Path) -> Iterator[TestClient]:
    with TestClient(create_app(Settings(model_repository=lm_repository))) as c:
        yield c
