"""Start-up is measured where it happens: phases logged and exposed as distilserve_startup_seconds."""

from __future__ import annotations

import time
from pathlib import Path

from fastapi.testclient import TestClient

from service.app import create_app
from service.settings import Settings
from service.startup import StartupClock, since_process_start_s
from tests.service.test_app import metric_value


def test_phases_add_up_and_the_imports_are_the_time_since_the_process_started() -> None:
    clock = StartupClock("test")
    assert 0 < clock.phases["imports"] < 3600  # this process started before the test
    imports = since_process_start_s()
    assert imports is not None and imports >= clock.phases["imports"]
    with clock.phase("sleep"):
        time.sleep(0.02)
    with clock.phase("sleep"):  # a phase entered twice adds up
        time.sleep(0.02)
    assert clock.phases["sleep"] >= 0.04
    assert list(clock.phases) == ["imports", "sleep"]


def test_the_engine_and_frontend_phases_are_on_metrics(tiny_repository: Path) -> None:
    with TestClient(create_app(Settings(model_repository=tiny_repository))) as client:
        text = client.get("/metrics").text
    for phase in ("imports", "repository", "sessions", "warm-up"):
        assert metric_value(text, "distilserve_startup_seconds", role="engine", phase=phase) > 0, phase
    assert metric_value(text, "distilserve_startup_seconds", role="frontend", phase="engine") > 0
