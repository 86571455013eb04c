"""The example Kubernetes and KServe manifests: probes on real routes, real knobs, the image's user."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml

from service.app import create_app
from service.settings import Settings
from tests.deploy.tools import DEPLOY

MANIFESTS = sorted((DEPLOY / "kubernetes").glob("*.yaml"))
KNOBS = {f"DISTILSERVE_{name.upper()}" for name in Settings.model_fields}


def pod_specs(path: Path) -> list[dict[str, Any]]:
    specs = []
    for doc in yaml.safe_load_all(path.read_text()):
        if doc["kind"] == "Deployment":
            specs.append(doc["spec"]["template"]["spec"])
        elif doc["kind"] == "InferenceService":
            specs.append(doc["spec"]["predictor"])
    return specs


def test_there_are_both_examples() -> None:
    assert [p.name for p in MANIFESTS] == ["distilserve.yaml", "kserve.yaml"]


@pytest.mark.parametrize("manifest", MANIFESTS, ids=lambda p: p.name)
def test_probes_ports_and_knobs_match_the_service(manifest: Path, tmp_path: Path) -> None:
    routes = set(create_app(Settings(model_repository=tmp_path)).openapi()["paths"])
    specs = pod_specs(manifest)
    assert specs
    for spec in specs:
        (container,) = spec["containers"]
        env = {e["name"]: e["value"] for e in container.get("env", [])}
        assert set(env) <= KNOBS, set(env) - KNOBS
        port = int(env.get("DISTILSERVE_PORT", Settings.model_fields["port"].default))
        named = {p.get("name"): p["containerPort"] for p in container["ports"]}
        assert port in named.values()
        probes = [container[k] for k in ("startupProbe", "livenessProbe", "readinessProbe") if k in container]
        assert any(p["httpGet"]["path"] in ("/ready", "/v2/health/ready") for p in probes)
        for probe in probes:
            assert probe["httpGet"]["path"] in routes, probe
            assert named.get(probe["httpGet"]["port"], probe["httpGet"]["port"]) == port
        if "terminationGracePeriodSeconds" in spec:
            grace = float(env.get("DISTILSERVE_SHUTDOWN_GRACE_S", 30))
            pause = float(container["lifecycle"]["preStop"]["exec"]["command"][-1])
            assert spec["terminationGracePeriodSeconds"] > grace + pause
            context = spec["securityContext"]
            assert context["runAsNonRoot"] and context["runAsUser"] == 10001  # the Dockerfile's USER


def test_the_autoscaler_scales_the_deployment_on_cpu_within_sane_bounds() -> None:
    docs = list(yaml.safe_load_all((DEPLOY / "kubernetes" / "distilserve.yaml").read_text()))
    (deployment,) = [d for d in docs if d["kind"] == "Deployment"]
    (hpa,) = [d for d in docs if d["kind"] == "HorizontalPodAutoscaler"]
    assert hpa["apiVersion"] == "autoscaling/v2"
    target = hpa["spec"]["scaleTargetRef"]
    assert (target["kind"], target["name"]) == ("Deployment", deployment["metadata"]["name"])
    assert 1 <= hpa["spec"]["minReplicas"] <= deployment["spec"]["replicas"] <= hpa["spec"]["maxReplicas"]
    (metric,) = hpa["spec"]["metrics"]
    assert metric["resource"]["name"] == "cpu"
    assert 0 < metric["resource"]["target"]["averageUtilization"] <= 100
    # a CPU target needs a CPU request to be a share of
    (container,) = deployment["spec"]["template"]["spec"]["containers"]
    assert "cpu" in container["resources"]["requests"]
