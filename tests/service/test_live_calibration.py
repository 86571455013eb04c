"""Live calibration: the cascade's default threshold recalibrated on what the pair serves, from the inputs the
cascade sends and a weighted sample of the rest (DISTILSERVE_CASCADE_CALIBRATION=live)."""

from __future__ import annotations

import random
import time
from pathlib import Path

import numpy as np
import pytest
from fastapi.testclient import TestClient

from common.cascade import calibrate
from service import live_calibration
from service.app import create_app
from service.live_calibration import LiveCalibration
from service.settings import Settings
from tests.service.test_app import metric_value
from tests.service.test_cascade import with_calibration


def population(n: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """Confidences, and agreement that grows more likely with confidence (as a real student's does)."""
    rng = np.random.default_rng(seed)
    c = rng.uniform(0.5, 1.0, n)
    return c, rng.uniform(0, 1, n) < 0.5 + 0.5 * (c - 0.5) / 0.5


def test_a_sample_weighted_by_what_each_check_stands_for_finds_the_populations_threshold() -> None:
    c, agreed = population(20_000, seed=0)
    truth = calibrate(c, agreed, 0.99).threshold
    changes: list[float] = []
    live = LiveCalibration(0.99, changes.append, background=False)
    served_at, rate, rng = 0.9, 0.1, random.Random(0)  # the export's threshold, the shadow rate
    for conf, same in zip(c, agreed, strict=True):
        if conf < served_at:
            live.sent(float(conf), bool(same))  # the cascade sends each of these: all are seen
        else:
            live.answered(1)
            if rng.random() < rate:
                live.checked(float(conf), bool(same))  # a tenth of the rest
    found = live.threshold()
    assert found is not None and changes[-1] == found
    assert abs(found - truth) < 0.01, (found, truth)
    # unweighted, the sample would under-count the student's disagreements above the old threshold
    assert live.current is not None and abs(live.current.fallback_rate - float((c < found).mean())) < 0.02


def test_the_exports_threshold_serves_until_enough_is_seen() -> None:
    live = LiveCalibration(0.99, background=False)
    for _ in range(live_calibration.LEAST):
        live.sent(0.3, False)
    live.answered(10)
    for _ in range(live_calibration.LEAST - 1):
        live.checked(0.95, True)
    assert live.threshold() is None
    live.checked(0.95, True)
    assert live.threshold() is not None


def test_served_the_live_threshold_is_the_calibration_of_what_was_served(
    pair_repository: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(live_calibration, "LEAST", 4)
    monkeypatch.setattr(live_calibration, "EVERY", 1)
    monkeypatch.setattr(live_calibration, "BACKGROUND", False)  # each input recalibrates at once
    texts = [f"review number {i}: {'good' if i % 3 else 'bad'} film {'indeed' * (i % 4)}" for i in range(24)]
    # the export's threshold from the student's own scores: about half the inputs sent on, half kept
    with TestClient(create_app(Settings(model_repository=pair_repository))) as c:
        alone = c.post(
            "/v1/classify", json={"inputs": texts, "model": "cls", "cascade_threshold": 0.0}
        ).json()
        teacher = c.post("/v1/classify", json={"inputs": texts, "model": "cls-teacher"}).json()
    scores = [row[0]["score"] for row in alone]
    agreed = [a[0]["label"] == t[0]["label"] for a, t in zip(alone, teacher, strict=True)]
    median = float(np.median(scores))  # a cascade that pays: the student runs first
    repository = with_calibration(
        pair_repository, tmp_path, threshold=median, fallback_rate=0.5, student_cost=0.4
    )
    settings = Settings(
        model_repository=repository, shadow_rate=1.0, cascade_calibration="live", max_wait_ms=0
    )
    with TestClient(create_app(settings)) as c:
        card = next(m for m in c.get("/v1/models").json()["models"] if m["name"] == "cls")
        assert card["cascade"]["live"]["active"] is False
        c.post("/v1/classify", json={"inputs": texts, "model": "cls"}).raise_for_status()
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:  # the shadow checks of the kept half come after the answer
            done = metric_value(c.get("/metrics").text, "distilserve_shadow_compared_total", model="cls")
            if done >= len(texts) / 2 - 1:
                break
            time.sleep(0.02)
        card = next(m for m in c.get("/v1/models").json()["models"] if m["name"] == "cls")
        live = card["cascade"]["live"]
        # shadow rate 1: every input was seen, so the live calibration is the whole population's
        expected = calibrate(scores, agreed, card["cascade"]["calibration"]["target_agreement"])
        assert live["active"] is True, (live, card["cascade"])
        assert live["sent_seen"] + live["checked_seen"] == len(texts)
        assert card["cascade"]["threshold"] == live["threshold"] == pytest.approx(expected.threshold)
        metrics = c.get("/metrics").text
        assert metric_value(metrics, "distilserve_cascade_threshold", model="cls") == pytest.approx(
            expected.threshold
        )
        answered = c.post("/v1/classify", json={"inputs": texts, "model": "cls"}).json()
        for score, row in zip(scores, answered, strict=True):  # the default now sends by the live threshold
            assert row[0]["model"] == ("cls-teacher" if score < expected.threshold else "cls")

        # models reloaded (model control builds the pairs again): what the calibration saw is kept
        from service.cascade import Pairs
        from service.live_calibration import LiveCalibrations

        state = c.app.state  # type: ignore[attr-defined]
        kept: LiveCalibrations = {}
        before = Pairs(state.registry, settings, state.metrics, None, kept)
        student = state.registry.get("cls", None)
        first = before.pair_of(student)
        assert first is not None and first.live is not None
        first.live.sent(0.1, False)
        again = Pairs(state.registry, settings, state.metrics, None, kept).pair_of(student)
        assert again is not None and again.live is first.live


def test_a_recalibration_runs_off_the_callers_thread_and_lands_when_done() -> None:
    c, agreed = population(4_000, seed=1)
    live = LiveCalibration(0.99)  # on a thread, as served
    live.answered(len(c))
    for conf, same in zip(c, agreed, strict=True):
        (live.sent if conf < 0.6 else live.checked)(float(conf), bool(same))
    deadline = time.monotonic() + 10
    while live.threshold() is None and time.monotonic() < deadline:
        time.sleep(0.01)
    assert live.threshold() is not None
    assert live.current is not None and live.current.sent_seen + live.current.checked_seen <= len(c)
