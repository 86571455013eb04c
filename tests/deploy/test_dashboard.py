"""The Grafana dashboard and the alert rules read only metrics (and labels) the service really exports."""

from __future__ import annotations

import json
from typing import Any

import httpx
import pytest
import yaml

from tests.deploy.tools import DEPLOY, Exposition, metric_names, selectors
from tests.service.live_server import LiveServer

# Labels Prometheus adds to every scraped series.
TARGET_LABELS = {"instance", "job"}
PROMETHEUS_OWN = {"up"}


def dashboard() -> dict[str, Any]:
    loaded: dict[str, Any] = json.loads((DEPLOY / "grafana" / "dashboards" / "distilserve.json").read_text())
    return loaded


def dashboard_queries() -> list[str]:
    board = dashboard()
    queries = [t["expr"] for p in board["panels"] for t in p.get("targets", [])]
    queries += [v["query"]["query"] for v in board["templating"]["list"] if v["type"] == "query"]
    return queries


def alert_queries() -> list[str]:
    rules = yaml.safe_load((DEPLOY / "prometheus" / "alerts.yml").read_text())
    return [rule["expr"] for group in rules["groups"] for rule in group["rules"]]


@pytest.fixture(scope="module")
def exposition(served: LiveServer) -> Exposition:
    return Exposition(httpx.get(f"{served.base_url}/metrics").text)


@pytest.mark.parametrize("source", ["dashboard", "alerts"])
def test_every_metric_read_is_exported(source: str, exposition: Exposition) -> None:
    queries = dashboard_queries() if source == "dashboard" else alert_queries()
    read = set().union(*(metric_names(q) for q in queries))
    assert len(read) >= 5, read
    missing = {name for name in read if exposition.family_of(name) is None}
    assert not missing, f"{source} reads metrics /metrics does not export: {sorted(missing)}"
    for query in queries:
        for name, matched in selectors(query):
            assert name.startswith("distilserve_") or name in PROMETHEUS_OWN, (name, query)
            if name in exposition.labels:  # series exist: their label names are known
                unknown = matched - exposition.labels[name] - TARGET_LABELS
                assert not unknown, f"{name} has no label(s) {sorted(unknown)}: {query}"


def test_the_panels_the_issue_asks_for() -> None:
    panels = {p["title"]: " ".join(t["expr"] for t in p.get("targets", [])) for p in dashboard()["panels"]}

    def panel_reading(*parts: str) -> str | None:
        return next((title for title, expr in panels.items() if all(part in expr for part in parts)), None)

    wanted = {
        "request rate": ("rate(distilserve_requests_total",),
        "latency p50/p95/p99": ("0.5,", "0.95,", "0.99,", "distilserve_request_duration_seconds_bucket"),
        "batch size": ("distilserve_batch_size_bucket",),
        "queue depth": ("distilserve_queue_depth",),
        "errors by status": ("by (status)", "distilserve_requests_total"),
        "time to first token": ("distilserve_time_to_first_token_seconds_bucket",),
        "tokens per second": ("rate(distilserve_generated_tokens_total",),
        "prefix cache share": ("distilserve_prefix_cache_tokens_total", "distilserve_prompt_tokens_total"),
    }
    missing = [what for what, parts in wanted.items() if panel_reading(*parts) is None]
    assert not missing, missing


def test_panels_are_laid_out_and_described() -> None:
    panels = dashboard()["panels"]
    assert len({p["id"] for p in panels}) == len(panels)
    for panel in panels:
        assert {"x", "y", "w", "h"} <= set(panel["gridPos"]), panel["title"]
        if panel["type"] != "row":
            assert panel.get("description") and panel.get("targets"), panel["title"]
