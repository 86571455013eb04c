"""One generation model's graphs from two or more repositories, served in turn: tokens/s and time to first
token at each stream count, on prompts of a chosen length.

    python -m benchmarks.served_graphs --model smollm2-teacher \\
        --repository build/real/smollm2/models-fused --repository build/real/smollm2/models-picked \\
        --texts ../shared/data/wikitext2_raw_valid.txt --words 200 --streams 1,16 --rounds 3

For a change of graph (an export's) rather than of the service (benchmarks.revisions): the same checkout
serves each repository on a fresh server, the repositories alternating `--rounds` times (this machine's speed
drifts within minutes: only side-by-side figures compare). Each streams `--new-tokens` tokens a request
(ignore_eos) from each stream count's clients back to back for `--seconds`, the prompts `--words`-word
openings of `--texts`' paragraphs (a prefill's cost grows with its prompt). DISTILSERVE_SPECULATIVE is
`--speculative` (off: a teacher decodes alone even where its repository pairs it with a student).
Writes OUT/served-graphs-MODEL-wWORDS.{md,json,png}.
"""

from __future__ import annotations

import json
import statistics
from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console

from benchmarks.long_prompts import engine_core_rss
from benchmarks.plots import saved_figure
from benchmarks.servers import SERVER_PIDS, serve
from benchmarks.streams import generation_load
from common.cli import one_command_app
from common.progress import ProgressLog
from loadtests.texts import openings

console = Console(stderr=True)

Rounds = list[dict[str, dict[int, dict[str, float]]]]  # round -> repository -> streams -> figures


def measure(
    repository: Path, model: str, env: dict[str, str], prompts: list[str], streams: list[int], seconds: float,
    new_tokens: int,
) -> dict[int, dict[str, float]]:  # fmt: skip
    """Each stream count's load on one fresh server of `repository`, after a short warm-up, and the engine
    core's RSS (MiB) after it (ONNX Runtime's arena keeps the largest call's memory)."""
    with serve(repository, env) as base:
        generation_load(base, model, 2, 3, new_tokens=8, prompts=prompts)
        figures = {}
        for n in streams:
            figures[n] = generation_load(base, model, n, seconds, new_tokens, prompts)
            figures[n]["engine_core_mib"] = engine_core_rss(SERVER_PIDS[base])
        return figures


def median(rounds: Rounds, repository: str, streams: int, key: str) -> float:
    return statistics.median(r[repository][streams][key] for r in rounds)


def render(model: str, words: int, names: list[str], streams: list[int], rounds: Rounds, command: str) -> str:
    first = names[0]
    lines = [
        f"# {model}'s graphs served in turn, {words}-word prompts (python -m benchmarks.served_graphs)",
        "",
        f"`{command}`",
        "",
        "| repository | streams | tokens/s by round | TTFT p50 ms by round | TTFT p99 ms by round "
        f"| tokens/s ÷ {first}'s (median) | engine core MiB after | errors |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for name in names:
        for n in streams:
            by_round = [r[name][n] for r in rounds]
            ratio = median(rounds, name, n, "tokens_per_s") / median(rounds, first, n, "tokens_per_s")
            tokens, p50, p99 = (
                " / ".join(format(x[key], spec) for x in by_round)
                for key, spec in (("tokens_per_s", ".1f"), ("ttft_p50_ms", ".0f"), ("ttft_p99_ms", ".0f"))
            )
            errors = sum(int(x["errors"]) for x in by_round)
            rss = " / ".join(f"{x.get('engine_core_mib', 0):,.0f}" for x in by_round)
            lines.append(f"| {name} | {n} | {tokens} | {p50} | {p99} | {ratio:.3f}x | {rss} | {errors} |")
    return "\n".join(lines) + "\n"


def plot(path: Path, names: list[str], streams: list[int], rounds: Rounds) -> None:
    """Median TTFT p50 and tokens/s per repository at each stream count, side by side."""
    with saved_figure(path, (5.0 * len(streams), 3.6), columns=2 * len(streams)) as axes:
        for i, n in enumerate(streams):
            for ax, key, label in (
                (axes[2 * i], "ttft_p50_ms", "TTFT p50, ms"),
                (axes[2 * i + 1], "tokens_per_s", "tokens/s"),
            ):
                ax.bar(range(len(names)), [median(rounds, name, n, key) for name in names])
                ax.set_xticks(range(len(names)), names, rotation=15, fontsize=7)
                ax.set_title(f"{label}, {n} stream{'s' if n > 1 else ''}", fontsize=9)


def main(
    repository: Annotated[
        list[Path], typer.Option(help="Repositories to serve in turn (two or more), each holding --model.")
    ],
    model: Annotated[str, typer.Option(help="The generation model's name in every repository.")],
    texts: Annotated[Path, typer.Option(help="Prompts: openings of this text file's paragraphs.")],
    words: Annotated[int, typer.Option(min=1, help="Words a prompt (its first words of a paragraph).")] = 200,
    streams: Annotated[str, typer.Option(help="Comma list of concurrent streams.")] = "1,16",
    seconds: Annotated[float, typer.Option(help="Seconds of load per stream count.")] = 20.0,
    new_tokens: Annotated[int, typer.Option(help="Tokens per request (ignore_eos).")] = 32,
    rounds: Annotated[int, typer.Option(min=1, help="Alternating rounds of every repository.")] = 2,
    speculative: Annotated[str, typer.Option(help="DISTILSERVE_SPECULATIVE for every server.")] = "off",
    out: Annotated[Path, typer.Option(help="Directory of the report.")] = Path("docs/bench"),
) -> None:
    """Served generation from each repository's graph of one model, the repositories alternating."""
    if len(repository) < 2:
        raise typer.BadParameter("two or more, to compare", param_hint="--repository")
    missing = [str(r) for r in repository if not (r / model).is_dir()]
    if missing:
        raise typer.BadParameter(f"no {model} in {', '.join(missing)}", param_hint="--repository")
    counts = [int(x) for x in streams.split(",") if x.strip()]
    prompts = openings(texts, 200, words=words, seed=11)
    env = {"DISTILSERVE_SPECULATIVE": speculative}
    names = [str(r) for r in repository]
    results: Rounds = []
    with ProgressLog("served graphs", rounds * len(repository), unit="servers", active=True) as progress:
        for _ in range(rounds):
            results.append({})
            for path, name in zip(repository, names, strict=True):
                progress.update(status=name)
                results[-1][name] = measure(path, model, env, prompts, counts, seconds, new_tokens)
                progress.update(advance=1)
    out.mkdir(parents=True, exist_ok=True)
    stem = out / f"served-graphs-{model}-w{words}"
    command = (
        f"python -m benchmarks.served_graphs --model {model} "
        + " ".join(f"--repository {n}" for n in names)
        + f" --texts {texts} --words {words} --streams {streams} --seconds {seconds:g} "
        f"--new-tokens {new_tokens} --rounds {rounds} --speculative {speculative}"
    )
    report = render(model, words, names, counts, results, command)
    stem.with_suffix(".md").write_text(report)
    stem.with_suffix(".json").write_text(json.dumps({"command": command, "rounds": results}, indent=2))
    plot(stem.with_suffix(".png"), names, counts, results)
    console.print(report)


app = one_command_app(main, help=__doc__)

if __name__ == "__main__":
    app()
