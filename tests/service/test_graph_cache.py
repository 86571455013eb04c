"""Optimised graphs kept between starts: written once, opened after, answering as the exported graph does."""

from __future__ import annotations

import logging
import os
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import pytest

from service import graph_cache
from service.engine import OrtEngine
from service.repository import ModelVersion, read_version
from service.runtime import ort_engine_factory
from service.settings import Settings
from tests.conftest import TASK_MODEL_NAMES
from tests.service.generation.test_tuning import greedy


def _version(repository: Path, task: str) -> ModelVersion:
    return read_version(repository / TASK_MODEL_NAMES[task] / "1")


def _engine(version: ModelVersion, cache: Path) -> OrtEngine:
    engine = ort_engine_factory(version, "fp32", Settings(device="cpu", graph_cache_dir=cache))
    assert isinstance(engine, OrtEngine)
    return engine


def _classify(engine: OrtEngine) -> np.ndarray:
    ids = np.array([[101, 7, 19, 33, 102, 0], [101, 5, 102, 0, 0, 0]], dtype=np.int64)
    feeds = {"input_ids": ids, "attention_mask": (ids != 0).astype(np.int64)}
    if "token_type_ids" in engine.input_names:
        feeds["token_type_ids"] = np.zeros_like(ids)
    return next(iter(engine.run(feeds).values()))


def test_a_graph_is_optimised_once_then_opened_from_the_cache_with_the_same_answers(
    tiny_repository: Path, tmp_path: Path
) -> None:
    classifier, lm = (
        _version(tiny_repository, "text-classification"),
        _version(tiny_repository, "text-generation"),
    )
    first, first_lm = _engine(classifier, tmp_path), _engine(lm, tmp_path)
    assert not first.from_cached_graph and not first_lm.from_cached_graph
    assert sorted(p.suffix for p in tmp_path.iterdir()) == [".onnx", ".onnx"]  # nothing half-written left
    again, again_lm = _engine(classifier, tmp_path), _engine(lm, tmp_path)
    assert again.from_cached_graph and again_lm.from_cached_graph
    np.testing.assert_allclose(_classify(again), _classify(first), rtol=1e-6, atol=1e-6)
    prompts = [[5, 9, 12], [7, 7, 30, 2, 11, 4]]
    assert greedy(again_lm, lm, prompts, 8) == greedy(first_lm, lm, prompts, 8)


def test_a_cached_graph_that_does_not_open_is_written_again(
    tiny_repository: Path, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    classifier = _version(tiny_repository, "text-classification")
    cached = graph_cache.cached_graph(tmp_path, classifier.manifest.variants["fp32"].sha256)
    cached.write_bytes(b"half a graph")  # a disk that filled up, a copy cut short
    with caplog.at_level(logging.WARNING):
        engine = _engine(classifier, tmp_path)
    assert not engine.from_cached_graph and "did not open" in caplog.text
    assert _engine(classifier, tmp_path).from_cached_graph  # the graph written in its place opens
    np.testing.assert_allclose(
        _classify(engine), _classify(OrtEngine(classifier.file("model.onnx"))), atol=1e-6
    )


def test_a_cache_that_cannot_be_written_leaves_sessions_opening_as_before(
    tiny_repository: Path, tmp_path: Path
) -> None:
    blocked = tmp_path / "a-file"
    blocked.write_text("not a directory")
    engine = _engine(_version(tiny_repository, "text-classification"), blocked / "graphs")
    assert not engine.from_cached_graph and _classify(engine).shape[0] == 2


def test_another_file_runtime_or_processor_misses_the_cache(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    here = graph_cache.cached_graph(tmp_path, "a" * 64)
    assert graph_cache.cached_graph(tmp_path, "a" * 64) == here
    assert graph_cache.cached_graph(tmp_path, "b" * 64) != here  # a new version's file
    monkeypatch.setattr(graph_cache, "machine_tag", lambda: "1.99.0|all|another-cpu")
    assert graph_cache.cached_graph(tmp_path, "a" * 64) != here  # an upgraded runtime, another machine type


def test_graphs_no_start_opened_for_a_week_go_when_a_new_one_is_written(
    tiny_repository: Path, tmp_path: Path
) -> None:
    retired, served = tmp_path / ("0" * 32 + ".onnx"), tmp_path / ("1" * 32 + ".onnx")
    for path in (retired, served):
        path.write_bytes(b"an optimised graph")
    week_ago = time.time() - 8 * 86400
    os.utime(retired, (week_ago, week_ago))
    os.utime(served, (week_ago, week_ago))
    graph_cache.opened(served)  # a start used it today
    _engine(_version(tiny_repository, "text-classification"), tmp_path)  # writes a new graph
    assert not retired.exists() and served.exists()
    assert len(list(tmp_path.glob("*.onnx"))) == 2


def test_sessions_opened_at_once_each_write_their_own_file_and_one_graph_stays(
    tiny_repository: Path, tmp_path: Path
) -> None:
    """Two loads of one file at once (replicas on one cache, or two in a process) write apart."""
    version = _version(tiny_repository, "text-generation")
    cached = graph_cache.cached_graph(tmp_path, version.manifest.variants["fp32"].sha256)
    names = {graph_cache.writing_path(cached) for _ in range(4)}
    assert len(names) == 4 and all(n.parent == tmp_path for n in names)
    with ThreadPoolExecutor(4) as pool:
        engines = list(pool.map(lambda _: _engine(version, tmp_path), range(4)))
    assert [p.name for p in tmp_path.iterdir()] == [cached.name]  # no half-written file left
    assert _engine(version, tmp_path).from_cached_graph
    prompts = [[5, 9, 12]]
    assert len({tuple(greedy(e, version, prompts, 6)[0]) for e in engines}) == 1
