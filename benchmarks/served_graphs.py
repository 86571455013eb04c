"""One generation model served in turn from several repositories' graphs and/or prefix-cache budgets: tokens/s
and time to first token at each stream count, on prompts of a chosen length.

    python -m benchmarks.served_graphs --model smollm2-teacher \\
        --repository build/real/smollm2/models-fused --repository build/real/smollm2/models-picked \\
        --texts ../shared/data/wikitext2_raw_valid.txt --words 200 --streams 1,16 --rounds 3
    python -m benchmarks.served_graphs --model smollm2-teacher \\
        --repository build/real/smollm2/models-picked --prefix-cache-mb 0,256 --shared-words 300 \\
        --words 20 --texts ../shared/data/wikitext2_raw_valid.txt
    python -m benchmarks.served_graphs --model smollm2-teacher --repository build/real/smollm2/models \\
        --variants fp32,int4 --texts ../shared/data/wikitext2_raw_valid.txt --words 20

For a change of graph (an export's) or of a generation setting rather than of the service's code
(benchmarks.revisions): the same checkout serves each repository at each `--prefix-cache-mb` and in each
of `--variants` (DISTILSERVE_VARIANT) on a fresh server, all of them alternating `--rounds` times (this
machine's speed drifts within minutes: only side-by-side figures compare). Each streams `--new-tokens`
tokens a request (ignore_eos) from each stream count's clients back to back for `--seconds`, the prompts
`--words`-word openings of `--texts`' paragraphs (a prefill's cost grows with its prompt), each after the
same `--shared-words`-word preamble where given (a document asked many questions, a few-shot prompt: what a
prefix cache is for). DISTILSERVE_SPECULATIVE is `--speculative` (off: a teacher decodes alone even where
its repository pairs it with a student).
Writes OUT/served-graphs-MODEL-wWORDS[-sharedN][-VARIANTS].{md,json,png}.
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
from benchmarks.wrk_load import metric_totals
from common.cli import one_command_app
from common.progress import ProgressLog
from loadtests.texts import openings

console = Console(stderr=True)

Rounds = list[dict[str, dict[int, dict[str, float]]]]  # round -> server -> streams -> figures


def measure(
    repository: Path, model: str, env: dict[str, str], prompts: list[str], streams: list[int], seconds: float,
    new_tokens: int,
) -> dict[int, dict[str, float]]:  # fmt: skip
    """Each stream count's load on one fresh server of `repository`, after a short warm-up: the engine core's
    RSS (MiB) after it (ONNX Runtime's arena keeps the largest call's memory), and the share of its prompt
    tokens read from the prefix cache."""
    with serve(repository, env) as base:
        generation_load(base, model, 2, 3, new_tokens=8, prompts=prompts)
        figures = {}
        for n in streams:
            before = metric_totals(base)
            figures[n] = generation_load(base, model, n, seconds, new_tokens, prompts)
            after = metric_totals(base)
            prompt, cached = (
                after.get(name, 0.0) - before.get(name, 0.0)
                for name in ("distilserve_prompt_tokens_total", "distilserve_prefix_cache_tokens_total")
            )
            figures[n]["cached_share"] = cached / prompt if prompt else 0.0
            figures[n]["engine_core_mib"] = engine_core_rss(SERVER_PIDS[base])
        return figures


def counts_of(text: str, option: str, least: int) -> list[str]:
    """A comma list of whole numbers, each at least `least`, checked here rather than by a server that
    will not start (`--prefix-cache-mb 0,256`, `--streams 1,16`)."""
    items = [x.strip() for x in text.split(",") if x.strip()]
    if not all(x.isdigit() and int(x) >= least for x in items):
        raise typer.BadParameter(f"{text!r}: a comma list of whole numbers from {least}", param_hint=option)
    return items


def preamble(texts: Path, words: int) -> str:
    """`words` words of `texts`' paragraphs run together: one document every prompt quotes (a paragraph
    alone is often shorter than asked)."""
    paragraphs = openings(texts, 40, words=words, seed=5)
    return " ".join(" ".join(paragraphs).split()[:words])


def spread(prompts: list[str]) -> str:
    """The prompts' words: median (least to most); an opening is cut at a paragraph's end."""
    counts = [len(p.split()) for p in prompts]
    return f"{statistics.median(counts):g} words a prompt ({min(counts)} to {max(counts)})"


def median(rounds: Rounds, repository: str, streams: int, key: str) -> float:
    return statistics.median(r[repository][streams][key] for r in rounds)


def render(
    model: str, prompts: str, names: list[str], streams: list[int], rounds: Rounds, command: str
) -> str:
    first = names[0]
    lines = [
        f"# {model} served in turn, {prompts} (python -m benchmarks.served_graphs)",
        "",
        f"`{command}`",
        "",
        "| server | streams | tokens/s by round | TTFT p50 ms by round | TTFT p99 ms by round "
        f"| tokens/s ÷ {first}'s (median) | prompt tokens cached | engine core MiB after | errors |",
        "|---|---|---|---|---|---|---|---|---|",
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
            cached = f"{median(rounds, name, n, 'cached_share'):.1%}"
            lines.append(
                f"| {name} | {n} | {tokens} | {p50} | {p99} | {ratio:.3f}x | {cached} | {rss} | {errors} |"
            )
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
        list[Path], typer.Option(help="Repositories to serve in turn, each holding --model.")
    ],
    model: Annotated[str, typer.Option(help="The generation model's name in every repository.")],
    texts: Annotated[Path, typer.Option(help="Prompts: openings of this text file's paragraphs.")],
    words: Annotated[int, typer.Option(min=1, help="Words a prompt (its first words of a paragraph).")] = 200,
    shared_words: Annotated[
        int, typer.Option(min=0, help="Words of one preamble every prompt begins with (0: none).")
    ] = 0,
    prefix_cache_mb: Annotated[
        str,
        typer.Option(help="Comma list of DISTILSERVE_GEN_PREFIX_CACHE_MB, each repository served at each."),
    ] = "",
    streams: Annotated[str, typer.Option(help="Comma list of concurrent streams.")] = "1,16",
    seconds: Annotated[float, typer.Option(help="Seconds of load per stream count.")] = 20.0,
    new_tokens: Annotated[int, typer.Option(help="Tokens per request (ignore_eos).")] = 32,
    rounds: Annotated[int, typer.Option(min=1, help="Alternating rounds of every repository.")] = 2,
    speculative: Annotated[str, typer.Option(help="DISTILSERVE_SPECULATIVE for every server.")] = "off",
    variants: Annotated[
        str, typer.Option(help="Comma list of DISTILSERVE_VARIANT, each repository served in each.")
    ] = "",
    out: Annotated[Path, typer.Option(help="Directory of the report.")] = Path("docs/bench"),
) -> None:
    """Served generation of one model from each repository at each prefix-cache budget, alternating."""
    budgets = counts_of(prefix_cache_mb, "--prefix-cache-mb", 0) or [""]
    served_variants = [v.strip() for v in variants.split(",") if v.strip()] or [""]
    if len(repository) * len(budgets) * len(served_variants) < 2:
        raise typer.BadParameter(
            "two or more servers to compare: repositories x budgets x variants", param_hint="--repository"
        )
    missing = [str(r) for r in repository if not (r / model).is_dir()]
    if missing:
        raise typer.BadParameter(f"no {model} in {', '.join(missing)}", param_hint="--repository")
    counts = [int(x) for x in counts_of(streams, "--streams", 1)]
    prompts = openings(texts, 200, words=words, seed=11)
    kind = f"openings of up to {words} words"
    if shared_words:
        shared = preamble(texts, shared_words)
        prompts = [f"{shared}\n\n{p}" for p in prompts]
        kind += f" after the same {shared_words}-word preamble"
    kind += f": {spread(prompts)}"
    servers: dict[str, tuple[Path, dict[str, str]]] = {}
    for path in repository:
        for mb in budgets:
            for variant in served_variants:
                env = {"DISTILSERVE_SPECULATIVE": speculative}
                name = str(path) + (f", prefix cache {mb} MB" if len(budgets) > 1 else "")
                name += f", {variant}" if len(served_variants) > 1 else ""
                env |= {"DISTILSERVE_GEN_PREFIX_CACHE_MB": mb} if mb else {}
                servers[name] = (path, env | ({"DISTILSERVE_VARIANT": variant} if variant else {}))
    results: Rounds = []
    with ProgressLog("served graphs", rounds * len(servers), unit="servers", active=True) as progress:
        for _ in range(rounds):
            results.append({})
            for name, (path, env) in servers.items():
                progress.update(status=name)
                results[-1][name] = measure(path, model, env, prompts, counts, seconds, new_tokens)
                progress.update(advance=1)
    out.mkdir(parents=True, exist_ok=True)
    stem = out / f"served-graphs-{model}-w{words}{f'-shared{shared_words}' if shared_words else ''}"
    stem = stem.with_name(stem.name + ("-" + "-".join(served_variants) if variants else ""))
    command = (
        f"python -m benchmarks.served_graphs --model {model} "
        + " ".join(f"--repository {path}" for path in repository)
        + (f" --prefix-cache-mb {prefix_cache_mb}" if prefix_cache_mb else "")
        + (f" --shared-words {shared_words}" if shared_words else "")
        + (f" --variants {variants}" if variants else "")
        + f" --texts {texts} --words {words} --streams {streams} --seconds {seconds:g} "
        f"--new-tokens {new_tokens} --rounds {rounds} --speculative {speculative}"
    )
    names = list(servers)
    report = render(model, kind, names, counts, results, command)
    stem.with_suffix(".md").write_text(report)
    stem.with_suffix(".json").write_text(json.dumps({"command": command, "rounds": results}, indent=2))
    plot(stem.with_suffix(".png"), names, counts, results)
    console.print(report)


app = one_command_app(main, help=__doc__)

if __name__ == "__main__":
    app()
