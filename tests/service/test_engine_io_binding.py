"""The engine's IO binding (the GPU's code path), forced on with the CPU provider: the same outputs as plain
runs, values kept on the device feed the next call, and the setting reaches the engine."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnxruntime as ort
import pytest

from service.engine import EngineError, OrtEngine
from service.repository import read_version
from service.runtime import ort_engine_factory
from service.settings import Settings
from tests.conftest import TASK_MODEL_NAMES


def engines(repository: Path, task: str) -> tuple[OrtEngine, OrtEngine]:
    path = read_version(repository / TASK_MODEL_NAMES[task] / "1").file("model.onnx")
    return OrtEngine(path, device="cpu", io_binding="on"), OrtEngine(path, device="cpu", io_binding="off")


def feeds(engine: OrtEngine, batch: int, length: int) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(batch * 100 + length)
    ids = rng.integers(5, 90, size=(batch, length), dtype=np.int64)
    mask = np.ones_like(ids)
    mask[0, length // 2 :] = 0  # one padded row
    arrays = {"input_ids": ids, "attention_mask": mask, "token_type_ids": np.zeros_like(ids)}
    return {k: v for k, v in arrays.items() if k in engine.input_names}


@pytest.mark.parametrize("task", ["text-classification", "question-answering", "fill-mask"])
def test_bound_runs_equal_plain_runs_call_after_call(tiny_repository: Path, task: str) -> None:
    bound, plain = engines(tiny_repository, task)
    assert bound.binds_io and not plain.binds_io
    for batch, length in [
        (1, 5),
        (4, 17),
        (2, 9),
        (4, 17),
    ]:  # shapes change and repeat: the binding is reused
        given = feeds(bound, batch, length)
        got, want = bound.run(given), plain.run(given)
        assert got.keys() == want.keys()
        for name in want:
            assert isinstance(got[name], np.ndarray) and got[name].shape == want[name].shape
            np.testing.assert_array_equal(got[name], want[name])


def test_kept_outputs_stay_on_the_device_and_feed_the_next_call(tiny_repository: Path) -> None:
    bound, _ = engines(tiny_repository, "text-classification")
    given = feeds(bound, 2, 8)
    (name,) = bound.run(given).keys()
    kept = bound.run_bound(given, keep={name})[name]
    assert isinstance(kept, ort.OrtValue) and kept.device_name().lower() == "cpu"
    on_device = {k: bound.to_device(v) for k, v in given.items()}
    np.testing.assert_array_equal(bound.run_bound(on_device)[name], kept.numpy())


def test_a_failing_bound_call_is_an_engine_error_and_the_next_one_runs(tiny_repository: Path) -> None:
    bound, _ = engines(tiny_repository, "text-classification")
    given = feeds(bound, 2, 8)
    with pytest.raises(EngineError):
        bound.run({**given, "input_ids": given["input_ids"].astype(np.float32)})
    assert bound.run(given)


def test_the_setting_reaches_the_engine_and_auto_binds_only_on_cuda(
    tiny_repository: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    version = read_version(tiny_repository / TASK_MODEL_NAMES["text-classification"] / "1")
    monkeypatch.setenv("DISTILSERVE_IO_BINDING", "on")
    assert ort_engine_factory(version, "fp32", Settings(device="cpu")).binds_io  # type: ignore[attr-defined]
    monkeypatch.delenv("DISTILSERVE_IO_BINDING")
    assert Settings().io_binding == "auto"
    assert not ort_engine_factory(version, "fp32", Settings(device="cpu")).binds_io  # type: ignore[attr-defined]
