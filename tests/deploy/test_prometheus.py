"""A real Prometheus with the repository's prometheus.yml and alerts.yml scrapes a running service.

Only the targets change: Docker's DNS name `api` becomes the test's 127.0.0.1 port, and intervals shrink
to a second so the test need not wait. Everything else (job, metrics path, rule files) is the file as shipped.
Also: promtool checks the config and runs the alert rules' unit tests (tests/deploy/alerts_test.yml).
"""

from __future__ import annotations

import re
import subprocess
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml

from tests.conftest import EMBEDDING_STUDENT, EMBEDDING_TEACHER, PAIR_NAMES, TASK_MODEL_NAMES
from tests.deploy.test_dashboard import alert_queries, dashboard
from tests.deploy.tools import DEPLOY, REPO, require_tool
from tests.service.live_server import LiveServer, free_port

CONFIG = DEPLOY / "prometheus" / "prometheus.yml"


def local_config(service_port: int, prometheus_port: int) -> dict[str, Any]:
    """The shipped config with its targets on 127.0.0.1, 1 s intervals and absolute rule-file paths."""
    config: dict[str, Any] = yaml.safe_load(CONFIG.read_text())
    config["global"].update(scrape_interval="1s", evaluation_interval="1s")
    config["rule_files"] = [str(CONFIG.parent / name) for name in config["rule_files"]]
    for job in config["scrape_configs"]:
        job.pop("scrape_timeout", None)  # must not exceed the (now 1 s) interval
        if job["job_name"] == "distilserve":
            (sd,) = job.pop("dns_sd_configs")
            assert sd["names"] == ["api"] and sd["port"] == 8000  # docker-compose.yml's api replicas
            job["static_configs"] = [{"targets": [f"127.0.0.1:{service_port}"]}]
        else:
            assert job["static_configs"] == [{"targets": ["127.0.0.1:9090"]}]
            job["static_configs"] = [{"targets": [f"127.0.0.1:{prometheus_port}"]}]
    return config


def wait_for(what: str, check: Callable[[], Any], timeout_s: float = 30) -> Any:
    """Poll `check` until it returns something truthy; fail with `what` after `timeout_s`."""
    deadline = time.monotonic() + timeout_s
    last_error: Exception | None = None
    while time.monotonic() < deadline:
        try:
            result = check()
            if result:
                return result
        except (httpx.HTTPError, KeyError, AssertionError) as e:
            last_error = e
        time.sleep(0.5)
    pytest.fail(f"Prometheus: {what} did not happen within {timeout_s} s ({last_error!r})")


class Prometheus:
    def __init__(self, base_url: str) -> None:
        self.base_url = base_url

    def api(self, path: str, **params: Any) -> Any:
        response = httpx.get(f"{self.base_url}/api/v1/{path}", params=params, timeout=10)
        body = response.json()
        assert body["status"] == "success", body
        return body["data"]

    def query(self, expr: str) -> list[dict[str, Any]]:
        data = self.api("query", query=expr)
        result: list[dict[str, Any]] = data["result"]
        return result


@pytest.fixture(scope="module")
def prometheus(served: LiveServer, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Prometheus]:
    binary = require_tool("prometheus")
    root = tmp_path_factory.mktemp("prometheus")
    port = free_port()
    config = root / "prometheus.yml"
    config.write_text(yaml.safe_dump(local_config(int(served.base_url.rsplit(":", 1)[1]), port)))
    log = (root / "prometheus.log").open("w")
    process = subprocess.Popen(
        [
            binary,
            f"--config.file={config}",
            f"--storage.tsdb.path={root / 'data'}",
            f"--web.listen-address=127.0.0.1:{port}",
        ],
        stdout=log,
        stderr=subprocess.STDOUT,
    )
    server = Prometheus(f"http://127.0.0.1:{port}")
    try:

        def ready() -> bool:
            if process.poll() is not None:
                pytest.fail(f"prometheus exited: {(root / 'prometheus.log').read_text()}")
            return httpx.get(f"{server.base_url}/-/ready", timeout=2).status_code == 200

        wait_for("readiness", ready)
        yield server
    finally:
        process.terminate()
        process.wait(timeout=30)
        log.close()


def test_distilserve_series_arrive(prometheus: Prometheus, served: LiveServer) -> None:
    def target_up() -> list[dict[str, Any]]:
        targets = prometheus.api("targets")["activeTargets"]
        return [t for t in targets if t["labels"]["job"] == "distilserve" and t["health"] == "up"]

    (target,) = wait_for("a healthy distilserve target", target_up)
    assert target["scrapeUrl"] == f"{served.base_url}/metrics"

    def distilserve_names() -> set[str]:
        return {name for name in prometheus.api("label/__name__/values") if name.startswith("distilserve_")}

    ours = wait_for("distilserve_ series", distilserve_names)
    assert {"distilserve_requests_total", "distilserve_request_duration_seconds_bucket"} <= ours
    assert {"distilserve_batch_size_bucket", "distilserve_time_to_first_token_seconds_bucket"} <= ours

    answered = prometheus.query('sum by (task, status) (distilserve_requests_total{job="distilserve"})')
    counts = {(r["metric"].get("task", ""), r["metric"]["status"]): float(r["value"][1]) for r in answered}
    assert counts[("text-classification", "200")] >= 1 and counts[("", "422")] >= 1, counts
    assert counts[("text-generation", "200")] >= 2, counts  # whole and streamed

    models = prometheus.api("label/model/values", **{"match[]": "distilserve_model_info"})
    pairs = {name for student in PAIR_NAMES.values() for name in (student, f"{student}-teacher")}
    assert set(models) == set(TASK_MODEL_NAMES.values()) | pairs | {EMBEDDING_STUDENT, EMBEDDING_TEACHER}


def test_the_alert_rules_load_and_evaluate(prometheus: Prometheus) -> None:
    def rules() -> list[dict[str, Any]]:
        return [rule for group in prometheus.api("rules")["groups"] for rule in group["rules"]]

    def evaluated() -> bool:
        loaded = rules()
        return len(loaded) == len(alert_queries()) and all(r["health"] == "ok" for r in loaded)

    wait_for("every alert rule loaded and evaluated", evaluated)
    # A healthy service: nothing pending or firing once the target has been scraped (before its first
    # scrape, `absent(up)` is rightly pending).
    wait_for("every alert inactive", lambda: all(r["state"] == "inactive" for r in rules()))


def test_every_dashboard_query_runs(prometheus: Prometheus) -> None:
    """Each panel's PromQL as Grafana sends it ($variables expanded); legend labels are on the result."""
    wait_for(
        "two scrapes (rate needs them)",
        lambda: prometheus.query('count_over_time(up{job="distilserve"}[1m]) >= 2'),
    )
    for panel in dashboard()["panels"]:
        for target in panel.get("targets", []):
            expr = re.sub(r"\$(instance|model)\b", ".*", target["expr"]).replace("$__rate_interval", "1m")
            result = prometheus.query(expr)
            if "batch_failures" in expr:  # no engine call failed: no series, rightly
                continue
            assert result, f"{panel['title']}: no series for {expr}"
            for label in re.findall(r"\{\{(\w+)\}\}", target.get("legendFormat", "")):
                assert all(label in r["metric"] for r in result), (panel["title"], label, result)


def test_promtool_checks_the_config_and_runs_the_alert_unit_tests() -> None:
    promtool = require_tool("promtool")
    for command in (["check", "config", str(CONFIG)], ["test", "rules", "tests/deploy/alerts_test.yml"]):
        done = subprocess.run([promtool, *command], cwd=REPO, capture_output=True, text=True)
        assert done.returncode == 0, done.stdout + done.stderr


def test_alert_unit_tests_cover_every_page_alert() -> None:
    tests = (Path(__file__).parent / "alerts_test.yml").read_text()
    rules = yaml.safe_load((CONFIG.parent / "alerts.yml").read_text())["groups"][0]["rules"]
    paging = [r["alert"] for r in rules if r["labels"]["severity"] == "page"]
    assert paging and all(f"alertname: {name}" in tests for name in paging)
