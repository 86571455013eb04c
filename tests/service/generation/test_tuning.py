"""The decoder's thread count on a CPU: measured at start-up, the faster one kept, answers unchanged."""

from __future__ import annotations

import math
from pathlib import Path

import pytest

import service.decoder_sessions
import service.engine_plan
from service.engine import Engine, OrtEngine
from service.generation.runner import DecoderRunner
from service.generation.sampling import SamplingParams
from service.generation.scheduler import StepPlan
from service.generation.sequence import Sequence
from service.generation.tuning import decode_step_s
from service.metrics import Metrics
from service.repository import ModelVersion, read_version
from service.runtime import load_engine_model, ort_engine_factory
from service.settings import Settings
from tests.conftest import TASK_MODEL_NAMES


@pytest.fixture
def lm(tiny_repository: Path) -> ModelVersion:
    return read_version(tiny_repository / TASK_MODEL_NAMES["text-generation"] / "1")


def greedy(
    engine: Engine, version: ModelVersion, prompts: list[list[int]], new_tokens: int
) -> list[list[int]]:
    """The prompts decoded together, greedily, on `engine`."""
    assert version.manifest.generation is not None
    runner = DecoderRunner(engine, version.manifest.generation)
    seqs = [Sequence(prompt=p, params=SamplingParams(max_new_tokens=new_tokens)) for p in prompts]
    plan = StepPlan(prefill=seqs, decode=[])
    for _ in range(new_tokens):
        result = runner.execute(plan)
        for seq in seqs:
            seq.output.append(result.tokens[seq.id])
        plan = StepPlan(prefill=[], decode=seqs)
    return [s.output for s in seqs]


def test_a_decode_step_is_timed_and_one_thread_decodes_as_two_do(lm: ModelVersion) -> None:
    assert lm.manifest.generation is not None
    engines = [OrtEngine(lm.file("model.onnx"), device="cpu", intra_op_threads=t) for t in (1, 2)]
    step = decode_step_s(engines[0], lm.manifest.generation, rows=4, prompt_tokens=8)
    assert 0 < step < 1 and math.isfinite(step)
    prompts = [[5, 9, 12], [7, 7, 30, 2, 11, 4], [3]]
    assert greedy(engines[0], lm, prompts, 8) == greedy(engines[1], lm, prompts, 8)


@pytest.mark.parametrize("faster", [1, 4])
def test_the_engine_core_serves_the_decoder_on_the_thread_count_that_ran_faster(
    lm: ModelVersion, monkeypatch: pytest.MonkeyPatch, faster: int
) -> None:
    monkeypatch.setattr(service.engine_plan, "available_cores", lambda: 4)
    built: dict[int, Engine] = {}

    def factory(version: ModelVersion, variant: str, settings: Settings) -> Engine:
        built[settings.intra_op_threads] = engine = ort_engine_factory(version, variant, settings)
        return engine

    def step_s(engine: Engine, *args: object) -> float:
        threads = next(t for t, e in built.items() if e is engine)
        return 0.001 if threads == faster else 0.002

    monkeypatch.setattr(service.decoder_sessions, "decode_step_s", step_s)
    model = load_engine_model(lm, Settings(device="cpu"), Metrics(), factory)
    assert sorted(built) == [1, 4]  # both were built and timed
    assert model.plan.threads == faster and model.placement().threads == faster
    assert model.engine is built[faster]


def test_a_thread_count_set_by_the_operator_is_not_second_guessed(
    lm: ModelVersion, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(service.engine_plan, "available_cores", lambda: 4)
    built: list[int] = []

    def factory(version: ModelVersion, variant: str, settings: Settings) -> Engine:
        built.append(settings.intra_op_threads)
        return ort_engine_factory(version, variant, settings)

    model = load_engine_model(lm, Settings(device="cpu", intra_op_threads=2), Metrics(), factory)
    assert built == [2] and model.plan.threads == 2


def test_a_timing_that_fails_keeps_all_cores_and_the_start_up_goes_on(
    lm: ModelVersion, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(service.engine_plan, "available_cores", lambda: 4)

    def broken(*args: object) -> float:
        raise RuntimeError("the timing broke")

    monkeypatch.setattr(service.decoder_sessions, "decode_step_s", broken)
    model = load_engine_model(lm, Settings(device="cpu"), Metrics(), ort_engine_factory)
    assert model.plan.threads == 4 and model.generation is not None


def test_a_decoder_whose_step_is_long_keeps_all_cores_without_a_second_session(
    lm: ModelVersion, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A busy step of SPLIT_PAYS_S or more on all cores is a model whose operators split well: the one-thread
    session is neither built nor timed (seconds of start-up for a real model)."""
    from service.generation.tuning import SPLIT_PAYS_S

    monkeypatch.setattr(service.engine_plan, "available_cores", lambda: 4)
    built: list[int] = []

    def factory(version: ModelVersion, variant: str, settings: Settings) -> Engine:
        built.append(settings.intra_op_threads)
        return ort_engine_factory(version, variant, settings)

    monkeypatch.setattr(service.decoder_sessions, "decode_step_s", lambda *args: SPLIT_PAYS_S * 1.5)
    model = load_engine_model(lm, Settings(device="cpu"), Metrics(), factory)
    assert built == [4] and model.plan.threads == 4
