"""Cold start: from `python -m service` to a 200 on /ready, and where the time went.

    python -m benchmarks.cold_start --repository models --repository build/bench-models/minilm-shaped-repo \\
        --runs 5 --out docs/bench

Each run starts the whole service (supervisor, engine core, frontends) as an operator would, polls /ready
every 10 ms, and reads the processes' own phases back from /metrics (`distilserve_startup_seconds{role,
phase}`, service/startup.py): the engine core's imports, repository (manifests and checksums), sessions,
warm-up; a frontend's imports and its wait for the core. Medians of `--runs`.
"""

from __future__ import annotations

import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Annotated

import httpx
import typer
from rich.console import Console

from benchmarks.servers import free_port
from common.cli import cli_app
from common.progress import ProgressLog

console = Console(stderr=True)
app = cli_app(help=__doc__)


def one_start(repository: Path, timeout_s: float = 300) -> tuple[float, dict[tuple[str, str], float]]:
    """Seconds to /ready, and each (role, phase) as the processes measured it."""
    port = free_port()
    base = f"http://127.0.0.1:{port}"
    started = time.perf_counter()
    command = [sys.executable, "-m", "service", "--port", str(port), "--model-repository", str(repository)]
    process = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        with httpx.Client(base_url=base, timeout=2) as client:
            while True:
                if process.poll() is not None:
                    raise RuntimeError(f"the service exited with {process.returncode} before it was ready")
                try:
                    if client.get("/ready").status_code == 200:
                        ready = time.perf_counter() - started
                        break
                except httpx.TransportError:
                    pass
                if time.perf_counter() - started > timeout_s:
                    raise TimeoutError(f"not ready within {timeout_s:g} s")
                time.sleep(0.01)
            phases: dict[tuple[str, str], float] = {}
            for line in client.get("/metrics").text.splitlines():
                if line.startswith("distilserve_startup_seconds{"):
                    labels = dict(
                        part.split("=", 1) for part in line[line.index("{") + 1 : line.index("}")].split(",")
                    )
                    key = (labels["role"].strip('"'), labels["phase"].strip('"'))
                    phases[key] = max(phases.get(key, 0.0), float(line.rsplit(" ", 1)[1]))
        return ready, phases
    finally:
        process.terminate()
        process.wait(timeout=60)


@app.command()
def main(
    repository: Annotated[list[Path], typer.Option(help="A model repository (repeat for several).")],
    runs: Annotated[int, typer.Option(min=1)] = 5,
    out: Annotated[Path, typer.Option()] = Path("docs/bench"),
) -> None:
    lines = ["# Cold start: `python -m service` to /ready", ""]
    with ProgressLog.beside(console, "cold starts", runs * len(repository), unit="starts") as progress:
        for repo in repository:
            results = []
            for _ in range(runs):
                progress.update(status=str(repo))
                results.append(one_start(repo))
                progress.update(advance=1)
            ready = statistics.median(r[0] for r in results)
            keys = sorted({k for _, phases in results for k in phases})
            lines += [
                f"## {repo} ({runs} starts)",
                "",
                f"To /ready: median {ready:.2f} s (min {min(r[0] for r in results):.2f}, "
                f"max {max(r[0] for r in results):.2f}).",
                "",
                "| process | phase | median s |",
                "|---|---|---|",
            ]
            for role, phase in keys:
                values = [phases[(role, phase)] for _, phases in results if (role, phase) in phases]
                lines.append(f"| {role} | {phase} | {statistics.median(values):.2f} |")
            lines.append("")
    text = "\n".join(lines)
    out.mkdir(parents=True, exist_ok=True)
    (out / "cold_start.md").write_text(text, encoding="utf-8")
    print(text)


if __name__ == "__main__":
    app()
