"""DISTILSERVE_THREAD_SPINNING reaches ONNX Runtime's session, and only changes how its threads wait."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pydantic
import pytest

from service.engine import OrtEngine
from service.repository import read_version
from service.runtime import ort_engine_factory
from service.settings import Settings
from tests.conftest import TASK_MODEL_NAMES


def config(engine: OrtEngine, key: str) -> str:
    return engine._session.get_session_options().get_session_config_entry(key)


def test_threads_spin_within_a_call_and_stop_after_it_by_default(
    tiny_repository: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    version = read_version(tiny_repository / TASK_MODEL_NAMES["text-classification"] / "1")
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
