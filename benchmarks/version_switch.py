"""A rolling version switch under load: a new version lands in the repository while clients keep sending, and
the service (DISTILSERVE_MODEL_CONTROL=poll) moves to it without a failed request.

    python -m benchmarks.version_switch --repository models --model sentiment --connections 64 \\
        --out docs/bench

The model's highest version is copied into a scratch repository and served with `poll` (every `--poll-s`).
`--connections` clients each keep one connection and send /v2/models/<model>/infer back to back (the
answer names the version that gave it). After `--before-s` the next version is written beside it and renamed
in, as the export does; the run goes on until the old version is unloaded and `--after-s` more. Reported:
every request's status (errors must be 0), the version that answered, and latency by phase: before, during
the switch (from the new version's arrival to the old one's unload: validation, session, warm-up and the
drain all happen then, on the same cores), after. The clients run on the same cores as the service: say so
beside a figure.
"""

from __future__ import annotations

import asyncio
import json
import re
import shutil
import statistics
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated

import httpx
import typer

from benchmarks.open_loop import http_exchange, raw_post
from benchmarks.plots import saved_axes
from benchmarks.servers import serve
from common.cli import cli_app
from loadtests.texts import reviews

app = cli_app(help=__doc__)
VERSION = re.compile(rb'"model_version":"(\d+)"')


@dataclass(frozen=True)
class Answer:
    sent_s: float  # since the load started
    latency_s: float
    status: int  # 0: no answer (the connection failed)
    version: str


def stage_next_version(repository: Path, model: str) -> int:
    """The model's highest version copied as the next one, beside it and renamed in (atomic, as export)."""
    current = max(int(p.name) for p in (repository / model).iterdir() if p.name.isdigit())
    staging = repository / model / f".staging-{current + 1}"
    shutil.copytree(repository / model / str(current), staging)
    manifest = json.loads((staging / "manifest.json").read_text())
    manifest["version"] = current + 1
    (staging / "manifest.json").write_text(json.dumps(manifest, indent=2))
    staging.rename(repository / model / str(current + 1))
    return current + 1


async def _switch(
    base: str,
    repository: Path,
    model: str,
    connections: int,
    before_s: float,
    after_s: float,
    texts: list[str],
) -> tuple[list[Answer], dict[str, float]]:
    host, port = base.removeprefix("http://").split(":")
    path = f"/v2/models/{model}/infer"
    raws = [
        raw_post(
            host,
            path,
            json.dumps({"inputs": [{"name": "TEXT", "datatype": "BYTES", "shape": [1], "data": [t]}]}),
        )
        for t in texts
    ]
    answers: list[Answer] = []
    stop = asyncio.Event()
    started = time.perf_counter()

    async def client(i: int) -> None:
        reader, writer = await asyncio.open_connection(host, int(port))
        n = i
        while not stop.is_set():
            sent = time.perf_counter()
            try:
                status, body = await http_exchange(reader, writer, raws[n % len(raws)])
                found = VERSION.search(body)
                version = found.group(1).decode() if found else ""
            except (OSError, asyncio.IncompleteReadError, ValueError, IndexError):
                status, version = 0, ""
                reader, writer = await asyncio.open_connection(host, int(port))
            answers.append(Answer(sent - started, time.perf_counter() - sent, status, version))
            n += connections
        writer.close()

    tasks = [asyncio.create_task(client(i)) for i in range(connections)]
    await asyncio.sleep(before_s)
    old = max(int(p.name) for p in (repository / model).iterdir() if p.name.isdigit())
    landed = time.perf_counter() - started
    new = await asyncio.to_thread(stage_next_version, repository, model)
    marks = {"landed_s": landed, "old_version": float(old), "new_version": float(new)}
    async with httpx.AsyncClient(base_url=base, timeout=10) as http:
        while "unloaded_s" not in marks:
            await asyncio.sleep(0.05)
            index = (await http.post("/v2/repository/index")).json()
            states = {(e["name"], int(e["version"])): e["state"] for e in index}
            now = time.perf_counter() - started
            if states.get((model, new)) == "READY" and "ready_s" not in marks:
                marks["ready_s"] = now
            if states.get((model, old)) == "UNAVAILABLE":
                marks["unloaded_s"] = now
            if now - landed > 300:
                raise TimeoutError(f"no switch within 300 s: {index}")
    await asyncio.sleep(after_s)
    stop.set()
    await asyncio.gather(*tasks)
    firsts = [a.sent_s for a in answers if a.version == str(new)]
    marks["first_new_s"] = min(firsts) if firsts else float("nan")
    return answers, marks


def _phase(answers: list[Answer], start: float, end: float) -> dict[str, float]:
    inside = [a for a in answers if start <= a.sent_s < end]
    latencies = sorted(a.latency_s for a in inside)
    if not latencies:
        return {"requests": 0, "rps": 0.0, "p50_ms": float("nan"), "p99_ms": float("nan"), "errors": 0}
    return {
        "requests": len(inside),
        "rps": len(inside) / max(end - start, 1e-9),
        "p50_ms": 1000 * statistics.median(latencies),
        "p99_ms": 1000 * latencies[min(len(latencies) - 1, int(0.99 * len(latencies)))],
        "errors": sum(a.status != 200 for a in inside),
    }


def plot(answers: list[Answer], marks: dict[str, float], out: Path) -> None:
    bucket = 0.25
    end = max(a.sent_s for a in answers)
    edges = [i * bucket for i in range(int(end / bucket) + 1)]
    p99, mids = [], []
    for lo in edges:
        inside = sorted(a.latency_s for a in answers if lo <= a.sent_s < lo + bucket)
        if inside:
            mids.append(lo + bucket / 2)
            p99.append(1000 * inside[min(len(inside) - 1, int(0.99 * len(inside)))])
    title = "Latency while a new version takes over"
    with saved_axes(out, (8, 3.2), title, "seconds", "latency ms", legend_at="upper left") as ax:
        ax.plot(mids, p99, lw=1.2, label="p99 per 0.25 s")
        ax.axvspan(marks["landed_s"], marks["unloaded_s"], color="orange", alpha=0.2, label="switch")
        first = "first answer by the new version"
        ax.axvline(marks["first_new_s"], color="green", lw=1, ls="--", label=first)


@app.command()
def main(
    repository: Annotated[Path, typer.Option(help="A model repository holding --model.")],
    model: Annotated[str, typer.Option()],
    connections: Annotated[int, typer.Option(min=1)] = 64,
    poll_s: Annotated[float, typer.Option(min=0.1)] = 1.0,
    frontends: Annotated[int, typer.Option(min=0, help="0: the service's automatic count.")] = 0,
    before_s: Annotated[float, typer.Option(min=1)] = 10,
    after_s: Annotated[float, typer.Option(min=1)] = 10,
    out: Annotated[Path, typer.Option()] = Path("docs/bench"),
) -> None:
    source = repository / model
    current = max(int(p.name) for p in source.iterdir() if p.name.isdigit())
    texts = reviews(500, seed=3, max_clauses=6)
    with tempfile.TemporaryDirectory(prefix="version-switch-") as scratch:
        root = Path(scratch)
        shutil.copytree(source / str(current), root / model / str(current))
        env = {"DISTILSERVE_MODEL_CONTROL": "poll", "DISTILSERVE_REPOSITORY_POLL_S": str(poll_s)}
        if frontends:
            env["DISTILSERVE_FRONTENDS"] = str(frontends)
        with serve(root, env) as base:
            print(f"serving {model} v{current} at {base}; {connections} clients", flush=True)
            answers, marks = asyncio.run(_switch(base, root, model, connections, before_s, after_s, texts))
    end = max(a.sent_s for a in answers)
    phases = {
        "before": _phase(answers, 1.0, marks["landed_s"]),  # the first second: connections opening
        "during the switch": _phase(answers, marks["landed_s"], marks["unloaded_s"]),
        "after": _phase(answers, marks["unloaded_s"], end),
        "whole run": _phase(answers, 0.0, end + 1e-9),
    }
    old, new = int(marks["old_version"]), int(marks["new_version"])
    lines = [
        f"# Version switch under load: {model} v{old} -> v{new}, poll every {poll_s:g} s, "
        f"{connections} clients",
        "",
        f"The new version landed at {marks['landed_s']:.2f} s; it was READY "
        f"{marks['ready_s'] - marks['landed_s']:.2f} s later, answered first "
        f"{marks['first_new_s'] - marks['landed_s']:.2f} s later, and v{old} was unloaded "
        f"{marks['unloaded_s'] - marks['landed_s']:.2f} s after it landed (the index is read every 50 ms).",
        "",
        "| phase | requests | req/s | p50 ms | p99 ms | errors |",
        "|---|---|---|---|---|---|",
    ]
    for name, p in phases.items():
        lines.append(
            f"| {name} | {p['requests']:.0f} | {p['rps']:.0f} | {p['p50_ms']:.1f} | {p['p99_ms']:.1f} | "
            f"{p['errors']:.0f} |"
        )
    after_switch = [a for a in answers if a.sent_s > marks["unloaded_s"]]
    lines += [
        "",
        f"Answers by v{old} after its unload: {sum(a.version == str(old) for a in after_switch)}; "
        f"non-200 answers in the whole run: {sum(a.status != 200 for a in answers)}.",
        "",
        f"![p99 over time]({model}-version_switch.png)",
    ]
    text = "\n".join(lines) + "\n"
    out.mkdir(parents=True, exist_ok=True)
    (out / f"version_switch-{model}.md").write_text(text, encoding="utf-8")
    plot(answers, marks, out / f"{model}-version_switch.png")
    print(text)


if __name__ == "__main__":
    app()
