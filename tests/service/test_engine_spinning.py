"""DISTILSERVE_THREAD_SPINNING reaches ONNX Runtime's session and only changes how its threads wait; `auto`
spins where one decoder runs at a time."""

from __future__ import annotations

import asyncio
import shutil
from pathlib import Path

import numpy as np
import pydantic
import pytest
from prometheus_client import CollectorRegistry

from service.engine import OrtEngine
from service.generation.tuning import thread_spinning
from service.manifest import Manifest, TeacherRef
from service.metrics import Metrics
from service.model_control import ModelControl
from service.repository import read_version
from service.runtime import ort_engine_factory
from service.settings import Settings
from service.startup import StartupClock
from tests.conftest import TASK_MODEL_NAMES


def config(engine: OrtEngine, key: str) -> str:
    return engine._session.get_session_options().get_session_config_entry(key)


def test_threads_spin_within_a_call_and_stop_after_it_unless_off(
    tiny_repository: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    version = read_version(tiny_repository / TASK_MODEL_NAMES["text-classification"] / "1")
    assert Settings().thread_spinning == "auto"  # one engine built alone: one call at a time, it spins
    engine = ort_engine_factory(version, "fp32", Settings(device="cpu"))
    assert isinstance(engine, OrtEngine)
    assert config(engine, "session.intra_op.allow_spinning") == "1"
    assert config(engine, "session.force_spinning_stop") == "1"  # never spinning between calls

    monkeypatch.setenv("DISTILSERVE_THREAD_SPINNING", "off")
    sleeping = ort_engine_factory(version, "fp32", Settings(device="cpu"))
    assert isinstance(sleeping, OrtEngine)
    assert config(sleeping, "session.intra_op.allow_spinning") == "0"

    ids = np.random.default_rng(0).integers(5, 90, size=(3, 11), dtype=np.int64)
    arrays = {"input_ids": ids, "attention_mask": np.ones_like(ids), "token_type_ids": np.zeros_like(ids)}
    feeds = {k: v for k, v in arrays.items() if k in engine.input_names}
    for name, value in engine.run(feeds).items():
        np.testing.assert_array_equal(value, sleeping.run(feeds)[name])


def test_an_unknown_spinning_mode_is_refused_by_name(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("DISTILSERVE_THREAD_SPINNING", "always")
    with pytest.raises(pydantic.ValidationError, match="thread_spinning"):
        Settings()


def decoder(tiny_repository: Path, name: str, teacher: str | None = None) -> Manifest:
    manifest = read_version(tiny_repository / TASK_MODEL_NAMES["text-generation"] / "1").manifest
    return manifest.model_copy(
        update={"name": name, "teacher": TeacherRef(name=teacher, version=1) if teacher else None}
    )


def test_auto_spins_where_one_decoder_runs_at_a_time(tiny_repository: Path) -> None:
    """Two decoders busy at once decode more with sleeping threads (docs/benchmarks.md); a student that
    drafts for its served teacher runs on the teacher's thread, and encoders run single-threaded calls."""
    encoder = read_version(tiny_repository / TASK_MODEL_NAMES["text-classification"] / "1").manifest
    assert thread_spinning([encoder]) == "run"
    assert thread_spinning([encoder, decoder(tiny_repository, "chat")]) == "run"
    pair = [decoder(tiny_repository, "chat"), decoder(tiny_repository, "chat-student", teacher="chat")]
    assert thread_spinning(pair) == "run"
    orphan = decoder(tiny_repository, "student", teacher="not-served")
    assert thread_spinning([decoder(tiny_repository, "chat"), orphan]) == "off"
    assert thread_spinning([decoder(tiny_repository, "a"), decoder(tiny_repository, "b")]) == "off"


def test_the_engine_core_decides_auto_from_its_repository(tmp_path: Path, tiny_repository: Path) -> None:
    lm = TASK_MODEL_NAMES["text-generation"]
    for name in (lm, "other-lm"):
        shutil.copytree(tiny_repository / lm / "1", tmp_path / name / "1")
    manifest = tmp_path / "other-lm" / "1" / "manifest.json"
    manifest.write_text(manifest.read_text().replace(f'"name": "{lm}"', '"name": "other-lm"'))
    settings = Settings(model_repository=tmp_path, device="cpu", warmup=False)
    control = ModelControl(settings, Metrics(CollectorRegistry()), ort_engine_factory)

    async def start() -> str:
        await control.start(StartupClock("test"))
        await control.close()
        return control.settings.thread_spinning

    assert asyncio.run(start()) == "off"  # two decoders that may be busy at once
