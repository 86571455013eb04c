"""Two revisions of the service side by side: fresh servers of each, alternating, in one run.

    python -m benchmarks.revisions --before 0ef40ad --repository models --out docs/bench

Machines drift (this 2-core one by ~2x over a day), so a figure from another day says nothing against one
from today; a bar like "one client's p50 within 0.5 ms of before" needs both served the same hour. Each
round serves `--before` (a git worktree made for the run, removed after) and the working tree, one after
the other, on the same repository and measures:
- one client's latency on the demo classifier (wrk, 1 connection): p50 and p99;
- generation at 16 streams (the `lm` model, 64 new tokens each): tokens/s and time to first token p50.
The older revision's own settings apply (e.g. before the engine core: one process, the engine inside).
Manifests written since the older revision carry fields its strict schema refuses, so it serves a copy of
the repository (model files linked) with those fields left out.
"""

from __future__ import annotations

import json
import statistics
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.console import Console

from benchmarks.servers import serve
from benchmarks.streams import generation_load
from benchmarks.wrk_load import load
from common.cli import cli_app
from common.progress import ProgressLog
from loadtests.texts import reviews

console = Console(stderr=True)
app = cli_app(help=__doc__)

BEFORE_ENGINE_CORE = "0ef40ad"  # the commit before the engine core and its frontends (issue 22)


@contextmanager
def worktree(revision: str) -> Iterator[Path]:
    """A checkout of `revision` for the block's duration."""
    with tempfile.TemporaryDirectory(prefix="distilserve-rev-") as tmp:
        path = Path(tmp) / "tree"
        subprocess.run(
            ["git", "worktree", "add", "--detach", str(path), revision], check=True, capture_output=True
        )
        try:
            yield path
        finally:
            subprocess.run(
                ["git", "worktree", "remove", "--force", str(path)], check=False, capture_output=True
            )


# Run inside the older tree: its own manifest schema says which fields it does not know; they are dropped.
_PRUNE = """
import json, sys
from pathlib import Path
from pydantic import ValidationError
from service.manifest import Manifest
for path in map(Path, sys.argv[1:]):
    raw = json.loads(path.read_text())
    try:
        Manifest.model_validate(raw)
    except ValidationError as e:
        for error in e.errors():
            if error["type"] == "extra_forbidden":
                *parents, key = error["loc"]
                node = raw
                for part in parents:
                    node = node[part]
                node.pop(key, None)
    path.write_text(json.dumps(raw, indent=2))
"""


def repository_for(tree: Path, repository: Path, into: Path) -> Path:
    """A copy of `repository` that `tree`'s service reads: manifests pruned, everything else linked."""
    manifests = []
    for source in repository.rglob("*"):
        target = into / source.relative_to(repository)
        if source.is_dir():
            target.mkdir(parents=True, exist_ok=True)
        elif source.name == "manifest.json":
            target.write_bytes(source.read_bytes())
            manifests.append(str(target))
        else:
            target.symlink_to(source.resolve())
    subprocess.run([sys.executable, "-c", _PRUNE, *manifests], cwd=tree, check=True)
    return into


def measure(repository: Path, tree: Path | None, seconds: int) -> dict[str, float]:
    """One client's classify latency, then 16 generation streams, each on a fresh server of `tree`."""
    bodies = [json.dumps({"inputs": t, "model": "sentiment"}) for t in reviews(500, seed=2)]
    env = {"DISTILSERVE_FRONTENDS": "1"}  # the service's CPU default; an older tree ignores it
    with serve(repository, env, tree=tree) as base:
        load("warm-up", base, "/v1/classify", bodies, 8, 2)
        one = load("1 client", base, "/v1/classify", bodies, 1, seconds)
    with serve(repository, env, tree=tree) as base:
        generation_load(base, "lm", 4, 2)  # warm-up
        streams = generation_load(base, "lm", 16, seconds)
    return {
        "p50_ms": one.p50_ms,
        "p99_ms": one.p99_ms,
        "tokens_per_s": streams["tokens_per_s"],
        "ttft_p50_ms": streams["ttft_p50_ms"],
    }


def render(before: str, after: str, rounds: list[dict[str, Any]]) -> str:
    lines = [
        f"# `{before}` against `{after}`, alternating fresh servers (python -m benchmarks.revisions)",
        "",
        "| round | 1 client p50, before / after | 1 client p99, before / after "
        "| 16 streams tokens/s, before / after | 16 streams TTFT p50, before / after |",
        "|---|---|---|---|---|",
    ]
    for i, r in enumerate(rounds, 1):
        b, a = r["before"], r["after"]
        lines.append(
            f"| {i} | {b['p50_ms']:.2f} / {a['p50_ms']:.2f} ms | {b['p99_ms']:.2f} / {a['p99_ms']:.2f} ms "
            f"| {b['tokens_per_s']:,.0f} / {a['tokens_per_s']:,.0f} "
            f"| {b['ttft_p50_ms']:.0f} / {a['ttft_p50_ms']:.0f} ms |"
        )

    def median(side: str, key: str) -> float:
        return statistics.median(r[side][key] for r in rounds)

    p50 = median("after", "p50_ms") - median("before", "p50_ms")
    tokens = median("after", "tokens_per_s") / median("before", "tokens_per_s")
    lines += [
        "",
        f"Medians: one client's p50 {p50:+.2f} ms after against before; "
        f"16 streams {tokens:.2f}x the tokens/s.",
    ]
    return "\n".join(lines) + "\n"


@app.command("run")
def run(
    before: Annotated[str, typer.Option(help="The older revision (a commit, tag or branch).")] = (
        BEFORE_ENGINE_CORE
    ),
    repository: Annotated[
        Path, typer.Option(help="A repository with `sentiment` and `lm` (make models).")
    ] = Path("models"),
    rounds: Annotated[int, typer.Option(help="Before/after pairs.")] = 3,
    seconds: Annotated[int, typer.Option(help="Seconds per measurement.")] = 8,
    out: Annotated[Path, typer.Option(help="Directory for revisions.md and revisions.json.")] = Path(
        "docs/bench"
    ),
) -> None:
    """Serve `--before` and the working tree alternately and compare latency and generation."""
    after = subprocess.run(
        ["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True
    ).stdout.strip()
    results: list[dict[str, Any]] = []
    with (
        worktree(before) as tree,
        tempfile.TemporaryDirectory(prefix="distilserve-rev-models-") as copy,
        ProgressLog.beside(console, "revisions", 2 * rounds, unit="servers") as log,
    ):
        before_repository = repository_for(tree, repository, Path(copy))
        for i in range(rounds):
            pair: dict[str, Any] = {}
            sides = (("before", tree, before_repository), ("after", None, repository))
            for side, side_tree, side_repository in sides:
                log.update(status=f"round {i + 1}: {side}")
                pair[side] = measure(side_repository, side_tree, seconds)
                log.update(advance=1)
                console.print(f"  round {i + 1} {side}: {pair[side]}")
            results.append(pair)
    out.mkdir(parents=True, exist_ok=True)
    (out / "revisions.json").write_text(
        json.dumps({"before": before, "after": after, "rounds": results}, indent=2)
    )
    report = render(before, f"{after} + working tree", results)
    (out / "revisions.md").write_text(report)
    console.print(report)


if __name__ == "__main__":
    app()
