"""The training loop on a tiny MLP: resume to the same weights, checkpoint rotation, early stopping,
gradient accumulation and mixed precision. Every run is a few dozen CPU steps."""

from __future__ import annotations

import json
import re
import time
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.nn as nn
from accelerate.state import AcceleratorState
from torch.utils.data import DataLoader

from training.checkpoints import STATE_FILE, checkpoints
from training.losses import LossTerms, hard_loss
from training.recipes import TrainConfig
from training.trainer import Batch, History, StepFn, train

EXAMPLES = 64


pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.fixture
def fresh_accelerate_state() -> Iterator[None]:
    """Accelerate fixes the mixed precision once per process: reset it around a test that changes it."""
    AcceleratorState._reset_state(reset_partial_state=True)
    yield
    AcceleratorState._reset_state(reset_partial_state=True)


def _loader(batch_size: int = 8, seeded: bool = True) -> DataLoader:
    """Two separable classes of 8-d points, shuffled with a seeded generator (as task loaders are)."""
    x = torch.randn(EXAMPLES, 8, generator=torch.Generator().manual_seed(0))
    labels = (x[:, 0] + x[:, 1] > 0).long()
    data = [{"x": x[i], "labels": labels[i]} for i in range(EXAMPLES)]
    return DataLoader(
        data,  # type: ignore[arg-type]  # a list is a map-style dataset
        batch_size=batch_size,
        shuffle=True,
        generator=torch.Generator().manual_seed(0) if seeded else None,
    )


def _model(dropout: float = 0.1) -> nn.Module:
    """Dropout on by default, so a resume is only exact when the RNG states come back too."""
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(8, 32), nn.Tanh(), nn.Dropout(dropout), nn.Linear(32, 2))


def _step(model: nn.Module, batch: Batch, teacher: nn.Module | None) -> LossTerms:
    return hard_loss(model(batch["x"]), batch["labels"])


class _Crash(Exception):
    """Stands in for a killed job."""


def _crashing_after(micro_batches: int) -> StepFn:
    calls = 0

    def step(model: nn.Module, batch: Batch, teacher: nn.Module | None) -> LossTerms:
        nonlocal calls
        calls += 1
        if calls > micro_batches:
            raise _Crash
        return _step(model, batch, teacher)

    return step


def _cfg(**overrides: Any) -> TrainConfig:
    base = TrainConfig(epochs=3, lr=1e-2, batch_size=8, warmup_ratio=0.2, cpu=True)
    return replace(base, **overrides)


def _run(
    cfg: TrainConfig, step: StepFn = _step, dropout: float = 0.1, seeded: bool = True
) -> tuple[nn.Module, History]:
    model = _model(dropout)
    history = train(model, _loader(cfg.batch_size, seeded), step, cfg, description="test")
    return model, history


def _same_weights(a: nn.Module, b: nn.Module) -> bool:
    return all(
        torch.equal(x, y) for x, y in zip(a.state_dict().values(), b.state_dict().values(), strict=True)
    )


@pytest.mark.parametrize(
    ("overrides", "crash_after", "batches_done", "seeded"),
    [
        ({}, 8 + 3, 0, True),  # killed in epoch 2: back to the end of epoch 1
        # 4 steps of 2 micro-batches per epoch, saved at step 6: 4 micro-batches into epoch 2
        ({"checkpoint_every_steps": 3, "grad_accum_steps": 2}, 8 + 5, 4, True),
        ({"checkpoint_every_steps": 3, "grad_accum_steps": 2}, 8 + 5, 4, False),
    ],
    ids=["epoch-end", "mid-epoch", "mid-epoch-unseeded-loader"],
)
def test_an_interrupted_run_resumes_to_the_same_weights(
    tmp_path: Path, overrides: dict[str, Any], crash_after: int, batches_done: int, seeded: bool
) -> None:
    cfg = _cfg(**overrides)
    uninterrupted, expected = _run(cfg, seeded=seeded)

    with_checkpoints = _cfg(**overrides, checkpoint_dir=str(tmp_path))
    with pytest.raises(_Crash):
        _run(with_checkpoints, _crashing_after(crash_after), seeded=seeded)
    newest = json.loads((checkpoints(tmp_path)[-1] / STATE_FILE).read_text())
    assert (newest["epoch"], newest["batches"]) == (1, batches_done)
    resumed, history = _run(_cfg(**overrides, checkpoint_dir=str(tmp_path), resume=True), seeded=seeded)

    assert _same_weights(resumed, uninterrupted)
    assert [s["loss"] for s in history.steps] == [s["loss"] for s in expected.steps]
    assert [s["lr"] for s in history.steps] == [s["lr"] for s in expected.steps]
    assert [e["train_loss"] for e in history.epochs] == [e["train_loss"] for e in expected.epochs]
    assert [e["examples"] for e in history.epochs] == [EXAMPLES] * 3


def test_only_the_newest_checkpoints_stay(tmp_path: Path) -> None:
    _run(_cfg(checkpoint_dir=str(tmp_path), checkpoint_every_steps=3, keep_checkpoints=2))

    kept = checkpoints(tmp_path)
    assert [p.name for p in kept] == ["step-00000021", "step-00000024"]
    assert sorted(p.name for p in tmp_path.iterdir()) == [p.name for p in kept]  # no partial saves left
    for name in ("model.safetensors", "optimizer.bin", "random_states_0.pkl", STATE_FILE):
        assert (kept[-1] / name).is_file(), name
    state = json.loads((kept[-1] / STATE_FILE).read_text())
    assert (state["epoch"], state["step"], state["batches"]) == (3, 24, 0)
    assert len(state["history"]["steps"]) == 24 and len(state["history"]["epochs"]) == 3
    mid = json.loads((kept[0] / STATE_FILE).read_text())
    assert (mid["epoch"], mid["step"], mid["batches"]) == (2, 21, 5)


def test_a_checkpoint_dir_is_never_reused_by_accident(tmp_path: Path) -> None:
    _run(_cfg(epochs=1, checkpoint_dir=str(tmp_path)))
    with pytest.raises(ValueError, match="already holds checkpoints"):
        _run(_cfg(epochs=1, checkpoint_dir=str(tmp_path)))
    with pytest.raises(ValueError, match="batches_per_epoch"):  # another batch size: skipping would lie
        _run(_cfg(epochs=1, batch_size=16, checkpoint_dir=str(tmp_path), resume=True))
    with pytest.raises(ValueError, match="no checkpoint"):
        _run(_cfg(epochs=1, resume=str(tmp_path / "missing")))


def test_a_checkpoint_of_another_model_is_refused_in_one_line(tmp_path: Path) -> None:
    with pytest.raises(_Crash):
        _run(_cfg(checkpoint_dir=str(tmp_path), checkpoint_every_steps=2), _crashing_after(6))
    wider = nn.Sequential(nn.Linear(8, 64), nn.Tanh(), nn.Dropout(0.1), nn.Linear(64, 2))
    with pytest.raises(
        ValueError, match=r"cannot resume from .*step-\d+: it holds another model's weights \(.*size"
    ):
        train(wider, _loader(), _step, _cfg(checkpoint_dir=str(tmp_path), resume=True), description="test")


def test_resume_without_checkpoints_starts_afresh(tmp_path: Path) -> None:
    fresh, _ = _run(_cfg(epochs=1))
    resumed, history = _run(_cfg(epochs=1, checkpoint_dir=str(tmp_path / "new"), resume=True))
    assert _same_weights(resumed, fresh) and len(history.epochs) == 1


class _Scripted:
    """An evaluate callback that returns a scripted metric and remembers the weights it was shown."""

    def __init__(self, values: list[float], name: str = "accuracy") -> None:
        self.values, self.name = values, name
        self.seen: list[dict[str, torch.Tensor]] = []

    def __call__(self, model: nn.Module) -> dict[str, float]:
        self.seen.append({k: v.clone() for k, v in model.state_dict().items()})
        value = self.values[len(self.seen) - 1]
        return {"accuracy": value} if self.name == "accuracy" else {"accuracy": 0.5, self.name: value}


@pytest.mark.parametrize(
    ("metric", "values"),
    [
        ({}, [0.5, 0.8, 0.7, 0.75, 0.9]),  # by default the first metric, higher is better
        ({"metric_name": "perplexity", "metric_mode": "min"}, [9.0, 4.0, 4.0, 5.0, 1.0]),
    ],
    ids=["accuracy", "perplexity"],
)
def test_early_stopping_stops_and_returns_the_best_weights(
    metric: dict[str, Any], values: list[float]
) -> None:
    evaluate = _Scripted(values, metric.get("metric_name", "accuracy"))
    model = _model()
    cfg = _cfg(epochs=5, early_stop_patience=2, **metric)
    history = train(model, _loader(), _step, cfg, evaluate=evaluate, description="test")

    assert len(history.epochs) == 4 and history.stopped_early  # epochs 3 and 4 did not beat epoch 2
    assert history.best_epoch == 2 and history.final()[evaluate.name] == values[1]
    scores = {"accuracy": values[1]} if not metric else {"accuracy": 0.5, "perplexity": values[1]}
    assert history.final_metrics() == scores  # what a report records for the returned weights
    assert all(torch.equal(v, evaluate.seen[1][k]) for k, v in model.state_dict().items())


def test_early_stopping_keeps_its_best_weights_across_a_resume(tmp_path: Path) -> None:
    values = [0.5, 0.8, 0.7, 0.6, 0.9]
    cfg = _cfg(epochs=5, early_stop_patience=2, checkpoint_dir=str(tmp_path))
    reference = _model()
    train(reference, _loader(), _step, cfg, evaluate=_Scripted(values), description="test")

    cfg = _cfg(epochs=5, early_stop_patience=2, checkpoint_dir=str(tmp_path / "again"))
    with pytest.raises(_Crash):  # killed in epoch 4, after the best epoch (2) and one worse one
        train(_model(), _loader(), _crashing_after(3 * 8 + 2), cfg, evaluate=_Scripted(values))
    resumed = _model()
    evaluate = _Scripted(values[3:])  # the resumed run evaluates epochs 4 and 5 at most
    cfg = _cfg(epochs=5, early_stop_patience=2, checkpoint_dir=str(tmp_path / "again"), resume=True)
    history = train(resumed, _loader(), _step, cfg, evaluate=evaluate, description="test")

    assert history.best_epoch == 2 and len(history.epochs) == 4 and len(evaluate.seen) == 1
    assert _same_weights(resumed, reference)


def test_gradient_accumulation_matches_one_big_batch() -> None:
    big, big_history = _run(_cfg(batch_size=8, max_grad_norm=0.5), dropout=0.0)
    accumulated, history = _run(_cfg(batch_size=4, grad_accum_steps=2, max_grad_norm=0.5), dropout=0.0)

    assert len(history.steps) == len(big_history.steps) == 3 * EXAMPLES // 8
    for a, b in zip(accumulated.state_dict().values(), big.state_dict().values(), strict=True):
        torch.testing.assert_close(a, b, rtol=0, atol=1e-6)
    # One schedule step per optimiser step (it ends at 0), and the logged loss averages the micro-batches.
    assert [s["lr"] for s in history.steps] == [s["lr"] for s in big_history.steps]
    assert history.steps[-1]["lr"] == 0.0
    for step, big_step in zip(history.steps, big_history.steps, strict=True):
        assert step["loss"] == pytest.approx(big_step["loss"], abs=1e-6)


def test_a_partial_accumulation_at_the_epoch_end_still_steps() -> None:
    model = _model()
    rows = [{"x": torch.zeros(8), "labels": torch.tensor(0)}] * 20
    loader: DataLoader = DataLoader(rows, batch_size=4)  # type: ignore[arg-type]
    history = train(model, loader, _step, _cfg(epochs=2, grad_accum_steps=2), description="test")
    assert [s["step"] for s in history.steps] == [1, 2, 3, 4, 5, 6]  # 5 batches -> 3 steps per epoch
    assert history.steps[-1]["lr"] == 0.0


def test_loss_falls() -> None:
    _, history = _run(_cfg(epochs=4))
    assert history.epochs[-1]["train_loss"] < 0.5 * history.steps[0]["loss"]
    assert history.epochs[-1]["examples_per_s"] > 0


@pytest.mark.usefixtures("fresh_accelerate_state")
def test_bf16_autocast_trains_fp32_weights() -> None:
    model, history = _run(_cfg(epochs=1, mixed_precision="bf16"))
    assert all(p.dtype == torch.float32 for p in model.parameters())
    assert all(torch.isfinite(torch.tensor(s["loss"])) for s in history.steps)
    assert model(torch.zeros(1, 8)).dtype == torch.float32  # the autocast wrapper is gone


def test_fp16_on_cpu_is_refused_not_silently_fp32() -> None:
    with pytest.raises(ValueError, match="fp16 needs a GPU"):
        _run(_cfg(epochs=1, mixed_precision="fp16"))


def test_config_rejects_settings_that_would_fail_late() -> None:
    with pytest.raises(
        ValueError, match=r"resume needs checkpoint_dir \(--resume latest needs --checkpoint-dir"
    ):
        TrainConfig(resume=True)
    with pytest.raises(ValueError, match="keep_checkpoints must be >= 1"):
        TrainConfig(keep_checkpoints=0)
    with pytest.raises(ValueError, match="dropout must be in"):
        TrainConfig(dropout=1.0)
    with pytest.raises(ValueError, match="needs an evaluate"):
        _run(_cfg(epochs=1, early_stop_patience=1))


def test_a_dropout_setting_holds_for_the_run() -> None:
    model, _ = _run(_cfg(epochs=1, dropout=0.0), dropout=0.5)
    assert all(m.p == 0.0 for m in model.modules() if isinstance(m, nn.Dropout))


def test_a_run_whose_output_is_not_a_terminal_prints_plain_progress_lines(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """In a log no bar draws: a line every DISTILSERVE_PROGRESS_INTERVAL_S seconds (here 10 ms) instead."""
    monkeypatch.setenv("DISTILSERVE_PROGRESS_INTERVAL_S", "0.01")

    def slow_step(model: nn.Module, batch: Batch, teacher: nn.Module | None) -> LossTerms:
        time.sleep(0.005)
        return _step(model, batch, teacher)

    _run(_cfg(epochs=2), slow_step)  # 16 steps, ~0.1 s
    lines = [line for line in capsys.readouterr().out.splitlines() if "/16 steps" in line]
    during = (
        r"test: epoch [12]/2, ([1-9]|1[0-5])/16 steps \(\d+%\), [\d.]+ steps/s, elapsed [\d:]+, ETA [\d:]+,"
    )
    assert any(re.match(during, line) for line in lines), lines  # written while the run went on
    assert re.fullmatch(
        r"test: epoch 2/2 done, 16/16 steps \(100%\), .*, loss [\d.]+, speed \d+ ex/s", lines[-1]
    )


def test_training_flushes_denormals_and_leaves_the_process_as_it_found_it(tmp_path: Path) -> None:
    tiny = torch.tensor([1e-40])  # a float32 subnormal

    def step(model: nn.Module, batch: Batch, teacher: nn.Module | None) -> LossTerms:
        assert (tiny * 1.0).item() == 0.0  # flushed while training (denormal steps are ~10x slower)
        return _step(model, batch, teacher)

    _run(_cfg(epochs=1), step)
    assert (tiny * 1.0).item() != 0.0  # off again: hypothesis, among others, needs IEEE subnormals
