"""ONNX Runtime's memory under varied shapes: the engine as the service builds it vs ORT's defaults.

    python -m benchmarks.arena_bench --repository models --seconds 180 --rounds 2

Every model of the repository (its highest version, the variant the service serves on a CPU) is loaded
in one process as the engine core loads it: one session per model, two single-threaded callers for an
encoder (the core's instances on 2 cores) and one for the decoder. Each caller sends batches of the shapes
traffic makes: mostly small batches of short texts, some long ones, QA windows up to the model's, decode
steps over every KV-cache length and a few prefills. Each configuration runs in a fresh process, the two
alternating (bounded, default, bounded, ...): on a shared machine only adjacent runs compare. Reported per
run: sequences/s, RSS at 1 minute and at the end (growth), and the most it reached.
"""

from __future__ import annotations

import json
import os
import random
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Annotated, Any

import numpy as np
import typer

from common.cli import cli_app
from common.progress import ProgressLog
from loadtests.process_memory import rss_mib

app = cli_app(help=__doc__)
CONFIGS = {"bounded": True, "default": False}  # name -> OrtEngine(bounded_memory=...)
SETTLED_S = 60.0


def shape(task: str, window: int, rng: random.Random) -> tuple[int, int, int]:
    """(batch, new tokens, cached tokens) of one engine call."""
    if task == "text-generation":
        if rng.random() < 0.1:  # a prefill
            return rng.randint(1, 4), rng.randint(4, min(40, window - 1)), 0
        return rng.randint(1, 16), 1, rng.randint(4, window - 1)  # a decode step
    if task == "question-answering":  # windows of long contexts
        return rng.choice([1, 1, 2, 3, 4, 6, 8]), rng.randint(min(48, window), window), 0
    roll = rng.random()
    length = rng.randint(6, 24) if roll < 0.7 else rng.randint(24, 80) if roll < 0.95 else window
    return rng.choice([1] * 6 + [2, 3, 4, 6, 8, 12, 16, 24, 32]), min(length, window), 0


def feeds(inputs: list[Any], batch: int, new: int, cached: int) -> dict[str, np.ndarray]:
    """Arrays for the manifest's inputs, their symbolic axes resolved to this call's sizes."""
    sizes = {
        "batch_size": batch,
        "sequence_length": new,
        "past_sequence_length": cached,
        "past_sequence_length + sequence_length": cached + new,
    }
    return {
        i.name: np.ones([sizes[d] if isinstance(d, str) else d for d in i.shape], dtype=i.dtype)
        for i in inputs
    }


def measure(repository: Path, bounded: bool, seconds: float, interval: float) -> dict[str, Any]:
    """One configuration in this process: sequences/s and RSS samples over `seconds`."""
    from service.engine import OrtEngine
    from service.repository import scan_repository
    from service.runtime import choose_variant

    latest: dict[str, Any] = {}
    for version in scan_repository(repository).versions:
        if version.name not in latest or version.version > latest[version.name].version:
            latest[version.name] = version
    callers = []
    for version in latest.values():
        m = version.manifest
        variant = m.variants[choose_variant(m, "auto", on_gpu=False)]
        engine = OrtEngine(
            version.file(variant.file), device="cpu", intra_op_threads=1, bounded_memory=bounded
        )
        for k in range(1 if m.task == "text-generation" else 2):
            callers.append((engine, m, random.Random(f"{m.name}-{k}")))  # the same calls in every run
    done = [0] * len(callers)
    stop = threading.Event()

    def call(i: int) -> None:
        engine, m, rng = callers[i]
        while not stop.is_set():
            batch, new, cached = shape(m.task, m.tokenizer.max_length, rng)
            engine.run(feeds(m.inputs, batch, new, cached))
            done[i] += batch

    threads = [threading.Thread(target=call, args=(i,), daemon=True) for i in range(len(callers))]
    started = time.monotonic()
    for t in threads:
        t.start()
    samples = []
    while (elapsed := time.monotonic() - started) < seconds:
        samples.append((round(elapsed, 1), rss_mib(os.getpid())))
        time.sleep(min(interval, max(0.0, seconds - elapsed)))
    stop.set()
    for t in threads:
        t.join()
    elapsed = time.monotonic() - started
    samples.append((round(elapsed, 1), rss_mib(os.getpid())))
    return {"sequences_per_s": sum(done) / elapsed, "samples": samples}


@app.command("one", hidden=True)
def one(config: str, repository: Path, seconds: float, interval: float = 5.0) -> None:
    print(json.dumps(measure(repository, CONFIGS[config], seconds, interval)))


def summary(result: dict[str, Any]) -> dict[str, float]:
    samples = result["samples"]
    settled = next((rss for t, rss in samples if t >= SETTLED_S), samples[-1][1])
    end = samples[-1][1]
    return {
        "sequences_per_s": result["sequences_per_s"],
        "rss_settled_mib": settled,
        "rss_end_mib": end,
        "growth": end / settled - 1,
        "rss_max_mib": max(rss for _, rss in samples),
    }


def render(runs: list[dict[str, Any]], seconds: float) -> str:
    lines = [
        f"| round | engine | sequences/s | RSS at 1 min, MiB | at the end ({seconds:.0f} s) | growth | max |",
        "|---:|---|---:|---:|---:|---:|---:|",
    ]
    for r in runs:
        s = r["summary"]
        lines.append(
            f"| {r['round']} | {r['config']} | {s['sequences_per_s']:.0f} | {s['rss_settled_mib']:.0f} "
            f"| {s['rss_end_mib']:.0f} | {s['growth']:+.1%} | {s['rss_max_mib']:.0f} |"
        )
    by_round: dict[int, dict[str, dict[str, float]]] = {}
    for r in runs:
        by_round.setdefault(r["round"], {})[r["config"]] = r["summary"]
    ratios = [
        pair["bounded"]["sequences_per_s"] / pair["default"]["sequences_per_s"]
        for pair in by_round.values()
        if len(pair) == 2
    ]
    if ratios:
        lines += [
            "",
            "bounded ÷ default sequences/s, each round back to back: "
            + ", ".join(f"{x:.2f}" for x in ratios)
            + f"; median {statistics.median(ratios):.2f}",
        ]
    return "\n".join(lines) + "\n"


@app.command("run")
def run(
    repository: Annotated[Path, typer.Option(help="The model repository (make models).")] = Path("models"),
    seconds: Annotated[float, typer.Option(help="Seconds each configuration runs.")] = 180.0,
    rounds: Annotated[int, typer.Option(help="Rounds of the two configurations, alternating.")] = 2,
    out: Annotated[Path | None, typer.Option(help="Also write the table and the samples (JSON).")] = None,
) -> None:
    """Both configurations, alternating, each in a fresh process; a markdown table on stdout."""
    runs = []
    with ProgressLog("arena bench", rounds * len(CONFIGS), unit="runs", active=True) as progress:
        for i in range(rounds):
            for config in CONFIGS:
                progress.update(status=f"round {i + 1} {config}")
                command = [sys.executable, "-m", "benchmarks.arena_bench", "one", config, str(repository)]
                command.append(str(seconds))
                done = subprocess.run(command, capture_output=True, text=True, check=True)
                result = json.loads(done.stdout.strip().splitlines()[-1])
                runs.append({"round": i + 1, "config": config, **result, "summary": summary(result)})
                progress.update(advance=1)
    table = render(runs, seconds)
    print(table)
    if out is not None:
        out.mkdir(parents=True, exist_ok=True)
        (out / "arena.md").write_text(table, encoding="utf-8")
        (out / "arena.json").write_text(json.dumps(runs, indent=1), encoding="utf-8")


if __name__ == "__main__":
    app()
