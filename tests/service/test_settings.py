"""Knobs come from DISTILSERVE_* env vars and CLI flags; flags win; bad values are refused."""

from __future__ import annotations

from pathlib import Path

import pytest
from pydantic import ValidationError

from service.settings import Settings, parse_cli


def test_env_vars_set_the_batching_knobs(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("DISTILSERVE_MAX_BATCH_SIZE", "7")
    monkeypatch.setenv("DISTILSERVE_MAX_BATCH_TOKENS", "999")
    monkeypatch.setenv("DISTILSERVE_MAX_WAIT_MS", "2.5")
    monkeypatch.setenv("DISTILSERVE_MAX_QUEUE", "11")
    s = Settings()
    assert (s.max_batch_size, s.max_batch_tokens, s.max_wait_ms, s.max_queue) == (7, 999, 2.5, 11)


def test_cli_flags_override_env(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("DISTILSERVE_PORT", "9000")
    monkeypatch.setenv("DISTILSERVE_MAX_BATCH_SIZE", "4")
    s = parse_cli(["--port", "9100", "--model-repository", "/srv/models"])
    assert s.port == 9100 and s.max_batch_size == 4 and s.model_repository == Path("/srv/models")


def test_a_switch_alone_means_true_and_takes_a_value_too() -> None:
    assert parse_cli(["--require-gpu"]).require_gpu is True
    assert parse_cli(["--require-gpu", "0"]).require_gpu is False
    assert parse_cli(["--warmup", "false", "--port", "9100"]).warmup is False


def test_a_missing_repository_is_one_clear_line(tmp_path: Path) -> None:
    from service.__main__ import main

    with pytest.raises(
        SystemExit, match=r"no model repository at .*nowhere: build the demo one with `make models`"
    ):
        main(["--model-repository", str(tmp_path / "nowhere")])


def test_bad_values_are_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("DISTILSERVE_MAX_BATCH_SIZE", "0")
    with pytest.raises(ValidationError, match="max_batch_size"):
        Settings()


def test_a_bad_flag_or_variable_is_a_usage_error_naming_it(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as exited:
        parse_cli(["--max-batch-size", "0"])
    assert exited.value.code == 2
    refused = "--max-batch-size / DISTILSERVE_MAX_BATCH_SIZE: Input should be greater than or equal to 1"
    assert refused in capsys.readouterr().err
    monkeypatch.setenv("DISTILSERVE_GEN_STREAM_INTERVAL_MS", "-1")
    with pytest.raises(SystemExit):
        parse_cli([])
    assert "--gen-stream-interval-ms / DISTILSERVE_GEN_STREAM_INTERVAL_MS" in capsys.readouterr().err


def test_help_lists_every_knob(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        parse_cli(["--help"])
    out = capsys.readouterr().out
    for name in Settings.model_fields:
        assert "--" + name.replace("_", "-") in out


def test_the_padding_floor_follows_the_device_unless_set(monkeypatch: pytest.MonkeyPatch) -> None:
    from service.engine import CUDA
    from service.engine_plan import CPU_PADDING_FLOOR, GPU_PADDING_FLOOR, padding_floor

    assert padding_floor(Settings(), "CPUExecutionProvider") == CPU_PADDING_FLOOR == 0.95
    assert padding_floor(Settings(), CUDA) == GPU_PADDING_FLOOR == 0.85
    monkeypatch.setenv("DISTILSERVE_MIN_PADDING_EFFICIENCY", "0.5")
    assert padding_floor(Settings(), "CPUExecutionProvider") == padding_floor(Settings(), CUDA) == 0.5


def test_instances_split_the_cores_on_a_cpu_and_stay_single_elsewhere() -> None:
    from service.engine_plan import EnginePlan, engine_plan

    s = Settings()
    assert engine_plan(s, on_gpu=False, generation=False, cores=4) == EnginePlan(instances=4, threads=1)
    assert engine_plan(s, on_gpu=True, generation=False, cores=4) == EnginePlan(instances=1, threads=4)
    assert engine_plan(s, on_gpu=False, generation=True, cores=4) == EnginePlan(instances=1, threads=4)
    two = Settings(instances=2)
    assert engine_plan(two, on_gpu=False, generation=False, cores=8) == EnginePlan(instances=2, threads=4)
    pinned = Settings(instances=3, intra_op_threads=2)
    assert engine_plan(pinned, on_gpu=False, generation=False, cores=8) == EnginePlan(instances=3, threads=2)
    assert EnginePlan(2, 3).settings(s).intra_op_threads == 3


def test_the_engine_core_plans_on_every_core_and_frontends_default_to_what_the_host_spares(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """One engine core per device owns the cores (frontends only tokenize and write JSON); a small box
    keeps them for it, a many-core GPU host runs several frontends to feed the device."""
    import service.engine_plan as planning
    from service.settings import frontend_count

    monkeypatch.setattr(planning, "available_cores", lambda: 8)
    plan = planning.engine_plan
    assert plan(Settings(), on_gpu=False, generation=False) == planning.EnginePlan(8, 1)
    assert plan(Settings(), on_gpu=True, generation=False) == planning.EnginePlan(1, 8)
    assert plan(Settings(), on_gpu=False, generation=True) == planning.EnginePlan(1, 8)
    assert [frontend_count(Settings(), cores) for cores in (1, 2, 4, 6, 8, 16, 64)] == [1, 1, 1, 2, 3, 7, 8]
    assert frontend_count(Settings(frontends=5), cores=2) == 5


def test_the_core_count_respects_a_container_cpu_quota(tmp_path: Path) -> None:
    import os

    from service.engine import available_cores, cgroup_cpu_quota

    cpu_max = tmp_path / "cpu.max"
    assert cgroup_cpu_quota(tmp_path / "absent") is None
    for text, cores in (
        ("max 100000\n", None),
        ("200000 100000\n", 2),
        ("150000 100000\n", 2),
        ("50000 100000", 1),
    ):
        cpu_max.write_text(text)
        assert cgroup_cpu_quota(cpu_max) == cores, text
    assert 1 <= available_cores() <= (os.cpu_count() or 1)
