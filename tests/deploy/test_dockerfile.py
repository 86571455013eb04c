"""The Dockerfile: hadolint at error level, and what the runtime stages must (not) contain."""

from __future__ import annotations

import re
import subprocess
import sys

from tests.deploy.tools import REPO, require_tool
from tests.service.live_server import LiveServer, free_port

RUNTIME_STAGES = ("runtime-cpu", "runtime-gpu")
HEAVY = ("torch", "transformers", "optimum", "accelerate")


def instructions() -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) with continuation lines joined and comments dropped."""
    text = re.sub(r"\\\n", " ", (REPO / "Dockerfile").read_text())
    lines = [line.strip() for line in text.splitlines()]
    return [(line.split()[0].upper(), line.split(maxsplit=1)[1]) for line in lines if line and line[0] != "#"]


def stages() -> dict[str, list[tuple[str, str]]]:
    found: dict[str, list[tuple[str, str]]] = {}
    current: list[tuple[str, str]] = []
    for op, args in instructions():
        if op == "FROM":
            current = found.setdefault(args.split()[-1], [])
        current.append((op, args))
    return found


def test_hadolint_finds_no_errors() -> None:
    hadolint = require_tool("hadolint")
    done = subprocess.run(
        [hadolint, "--failure-threshold", "error", "Dockerfile"], cwd=REPO, capture_output=True, text=True
    )
    assert done.returncode == 0, done.stdout + done.stderr


def test_runtime_stages_serve_only_as_non_root_with_a_healthcheck() -> None:
    all_stages = stages()
    for name in RUNTIME_STAGES:
        ops = all_stages[name]
        run = " ".join(args for op, args in ops if op == "RUN")
        assert not any(re.search(rf"\b{heavy}\b", run) for heavy in HEAVY), (name, run)
        assert not re.search(r"\[[^]]*(train|export)", run), (name, run)  # no training/export extras
        users = [args for op, args in ops if op == "USER"]
        assert users and users[-1].split(":")[0] not in ("root", "0"), (name, users)
        (healthcheck,) = [args for op, args in ops if op == "HEALTHCHECK"]
        assert 'CMD ["python", "/app/healthcheck.py"]' in healthcheck
        assert ("WORKDIR", "/app") in ops and ("COPY", "deploy/docker/healthcheck.py ./healthcheck.py") in ops
        (entrypoint,) = [args for op, args in ops if op == "ENTRYPOINT"]
        assert entrypoint == '["python", "-m", "service"]'  # exec form: the service gets SIGTERM itself


def test_every_copied_path_is_in_the_build_context() -> None:
    ignored = {
        line.strip() for line in (REPO / ".dockerignore").read_text().splitlines() if line and line[0] != "#"
    }
    for op, args in instructions():
        if op != "COPY" or "--from=" in args:
            continue
        for source in args.split()[:-1]:
            if source.startswith("--") or source == "models":  # models/: MODELS=local, built by the user
                continue
            assert (REPO / source).exists(), source
            assert source.split("/")[0] not in ignored, f"{source} is excluded by .dockerignore"


def test_the_container_healthcheck_follows_readiness(served: LiveServer) -> None:
    script = str(REPO / "deploy" / "docker" / "healthcheck.py")
    port = served.base_url.rsplit(":", 1)[1]
    assert subprocess.run([sys.executable, script, port]).returncode == 0
    assert subprocess.run([sys.executable, script, str(free_port())]).returncode == 1
    env_port = subprocess.run([sys.executable, script], env={"DISTILSERVE_PORT": port})
    assert env_port.returncode == 0
