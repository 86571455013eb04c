"""Sentence embeddings: the student's and the teacher's engine speed, and /v1/embeddings served at load
against the raw engine.

    python -m benchmarks.embeddings --repository build/real/embeddings/models --student embeddings \\
        --teacher embeddings-teacher --out docs/bench

1. ONNX Runtime alone (benchmarks.raw_engine, a fresh process each): sequences/s of each model at batch 32
   on every core, and as one single-threaded call per core (the service's CPU default); student ÷ teacher.
2. The service: wrk at `--connections` on /v1/embeddings, one review text a request, each model in turn;
   served ÷ the raw engine's best for that model.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated

import typer

from benchmarks.raw_engine import raw_in_process
from benchmarks.servers import serve
from benchmarks.wrk_load import load
from common.cli import cli_app
from loadtests.texts import reviews
from service.engine import available_cores

app = cli_app(help=__doc__)


def latest(repository: Path, name: str) -> Path:
    return max((p for p in (repository / name).iterdir() if p.name.isdigit()), key=lambda p: int(p.name))


@app.command()
def main(
    repository: Annotated[Path, typer.Option(help="Model repository with both embedding models.")],
    student: Annotated[str, typer.Option()] = "embeddings",
    teacher: Annotated[str, typer.Option()] = "embeddings-teacher",
    connections: Annotated[int, typer.Option(min=1)] = 64,
    seconds: Annotated[int, typer.Option(min=1)] = 15,
    out: Annotated[Path, typer.Option()] = Path("docs/bench"),
) -> None:
    cores = available_cores()
    raw = {
        name: {
            "b32": raw_in_process(latest(repository, name), 32, "cpu"),
            f"b32 {cores}x1": raw_in_process(latest(repository, name), 32, "cpu", cores),
        }
        for name in (student, teacher)
    }
    bodies = [json.dumps({"model": "{model}", "input": text}) for text in reviews(2000, seed=5)]
    served = {}
    with serve(repository, {}) as base:
        for name in (student, teacher):
            mine = [b.replace('"{model}"', json.dumps(name)) for b in bodies]
            served[name] = load(name, base, "/v1/embeddings", mine, connections, seconds)
    lines = [
        "# Sentence embeddings: engine and served speed",
        "",
        f"| model | raw b32 seq/s (1 call, {cores} threads) | raw b32 ({cores} x 1 thread) | served req/s "
        f"at {connections} connections | served ÷ best raw | p50 / p99 ms |",
        "|---|---|---|---|---|---|",
    ]
    for name in (student, teacher):
        best = max(raw[name].values())
        r = served[name]
        lines.append(
            f"| {name} | {raw[name]['b32']:,.0f} | {raw[name][f'b32 {cores}x1']:,.0f} | {r.rps:,.0f} | "
            f"{r.rps / best:.2f} | {r.p50_ms:.1f} / {r.p99_ms:.1f} |"
        )
    ratio = max(raw[student].values()) / max(raw[teacher].values())
    lines += ["", f"Student ÷ teacher, raw engine at batch 32 (best of both layouts): {ratio:.2f}x.", ""]
    text = "\n".join(lines)
    out.mkdir(parents=True, exist_ok=True)
    (out / "embeddings.md").write_text(text, encoding="utf-8")
    print(text)


if __name__ == "__main__":
    app()
