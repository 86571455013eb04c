"""Speculative decoding on a served teacher/student pair: tokens/s with and without the student drafting,
at 1 and 16 streams, the acceptance rate, and whether greedy outputs stay the teacher's own.

    python -m benchmarks.speculative --repository build/bench-spec/models --teacher lm-teacher \\
        --k 2:0,5 --out docs/bench

Servers take turns on the same machine (`--rounds` alternating rounds): the teacher with
DISTILSERVE_SPECULATIVE=off, then =on for each k (and each of `--drafts`: the student's draft variant, or the
variant it serves). Each streams `--new-tokens` tokens a request (ignore_eos:
fixed lengths) from `--streams` clients back to back for `--seconds`. Greedy identity: `--prompts` prompts
through /v1/generate on both, texts compared. Acceptance and tokens per teacher step come from the server's
own counters (distilserve_draft_tokens*, distilserve_speculative_checks_total), and draft tokens a generated
token (what drafting cost: each is a draft pass) with distilserve_generated_tokens_total.
"""

from __future__ import annotations

import json
import statistics
from pathlib import Path
from typing import Annotated, Any

import httpx
import typer
from rich.console import Console

from benchmarks.plots import saved_axes
from benchmarks.servers import serve
from benchmarks.streams import generation_load
from benchmarks.wrk_load import metric_totals
from common.cli import cli_app
from common.progress import ProgressLog
from loadtests.texts import openings, reviews

console = Console(stderr=True)
app = cli_app(help=__doc__)


REVIEWS = "the load generator's short reviews"


def draft_setting(item: str) -> tuple[str, ...]:
    """`K` or `K:CONFIDENCE` from `--k`, checked here rather than by a server that will not start."""
    parts = tuple(part.strip() for part in item.split(":", 1))
    try:
        good = int(parts[0]) >= 1 and (len(parts) == 1 or 0.0 <= float(parts[1]) <= 1.0)
    except ValueError:
        good = False
    if not good:
        raise typer.BadParameter(f"{item!r}: K (1 or more) or K:CONFIDENCE (0 to 1)", param_hint="--k")
    return parts


def greedy_texts(base: str, model: str, prompts: list[str], new_tokens: int) -> list[str]:
    with httpx.Client(base_url=base, timeout=300) as client:
        texts = []
        for prompt in prompts:
            body = {"model": model, "prompt": prompt, "max_new_tokens": new_tokens}
            r = client.post("/v1/generate", json=body)
            r.raise_for_status()
            texts.append(r.json()["generated_text"])
        return texts


def measure(
    repository: Path,
    teacher: str,
    env: dict[str, str],
    streams: list[int],
    seconds: float,
    new_tokens: int,
    prompts: list[str],
    load_prompts: list[str] | None = None,
) -> dict[str, Any]:
    """One server: greedy texts, then each stream count's load (`load_prompts`, or the load's own reviews),
    then its draft counters."""
    with serve(repository, env) as base:
        texts = greedy_texts(base, teacher, prompts, new_tokens)
        loads = {n: generation_load(base, teacher, n, seconds, new_tokens, load_prompts) for n in streams}
        totals = metric_totals(base)
    drafted = totals.get("distilserve_draft_tokens_total", 0.0)
    accepted = totals.get("distilserve_draft_tokens_accepted_total", 0.0)
    checks = totals.get("distilserve_speculative_checks_total", 0.0)
    generated = totals.get("distilserve_generated_tokens_total", 0.0)
    return {
        "texts": texts,
        "loads": loads,
        "acceptance": accepted / drafted if drafted else None,
        "tokens_per_check": 1 + accepted / checks if checks else None,
        "drafts_per_token": drafted / generated if drafted and generated else None,  # what drafting cost
    }


@app.command()
def main(
    repository: Annotated[Path, typer.Option(help="Model repository holding the teacher and its student.")],
    teacher: Annotated[str, typer.Option(help="The teacher's name (a student's manifest names it).")],
    k: Annotated[
        str,
        typer.Option(
            help="Comma list of draft lengths to measure, each K or K:CONFIDENCE (a round ends before K once "
            "the draft is less sure than CONFIDENCE of its last token; 0: always K; without: the service's "
            "default)."
        ),
    ] = "2:0,5",
    streams: Annotated[str, typer.Option(help="Comma list of concurrent streams.")] = "1,16",
    seconds: Annotated[float, typer.Option(help="Seconds of load per stream count.")] = 15.0,
    new_tokens: Annotated[int, typer.Option(help="Tokens per request (ignore_eos).")] = 64,
    drafts: Annotated[
        str,
        typer.Option(
            help="Comma list of DISTILSERVE_SPECULATIVE_DRAFT values, each k measured with each: auto (the "
            "student's draft variant where exported) and/or served (the variant the student answers with)."
        ),
    ] = "auto",
    rounds: Annotated[int, typer.Option(min=1, help="Alternating rounds of every setting.")] = 2,
    prompts: Annotated[int, typer.Option(min=1, help="Greedy prompts compared.")] = 16,
    texts: Annotated[
        Path | None,
        typer.Option(
            help="Prompts from this text file (40-word openings of its paragraphs, e.g. WikiText-2 valid: "
            "a distilled student's own kind of text) instead of the load generator's short reviews."
        ),
    ] = None,
    out: Annotated[Path, typer.Option(help="Directory of the report.")] = Path("docs/bench"),
) -> None:
    """Tokens/s of a teacher served alone and drafted by its student, side by side."""
    ks = [draft_setting(x) for x in k.split(",") if x.strip()]
    counts = [int(x) for x in streams.split(",") if x.strip()]
    load_prompts = None  # the load's own reviews
    texts_in = reviews(prompts, seed=11, max_clauses=2)
    if texts is not None:  # the greedy comparison's prompts, then the load's: none of them both
        drawn = openings(texts, prompts + 200, seed=11)
        texts_in, load_prompts = drawn[:prompts], drawn[prompts:]
    sources = [x.strip() for x in drafts.split(",") if x.strip()]
    settings: dict[str, dict[str, str]] = {"off": {"DISTILSERVE_SPECULATIVE": "off"}}
    for item in ks:
        for source in sources:
            name = f"k={item[0]}" + (f", confidence {item[1]}" if len(item) > 1 else "")
            env = {
                "DISTILSERVE_SPECULATIVE": "on",
                "DISTILSERVE_SPECULATIVE_TOKENS": item[0],
                "DISTILSERVE_SPECULATIVE_DRAFT": source,
            }
            if len(item) > 1:
                env["DISTILSERVE_SPECULATIVE_CONFIDENCE"] = item[1]
            settings[name + (f", {source}" if len(sources) > 1 else "")] = env
    runs: dict[str, list[dict[str, Any]]] = {name: [] for name in settings}
    with ProgressLog.beside(console, "speculative", rounds * len(settings), unit="servers") as progress:
        for _ in range(rounds):
            for name, env in settings.items():
                progress.update(status=name)
                runs[name].append(
                    measure(repository, teacher, env, counts, seconds, new_tokens, texts_in, load_prompts)
                )
                progress.update(advance=1)
    source = REVIEWS if texts is None else f"openings of {texts.name}'s paragraphs"
    text = report(teacher, runs, counts, rounds, seconds, new_tokens, source)
    stem = f"speculative-{teacher}" + ("" if texts is None else f"-{texts.stem}")
    out.mkdir(parents=True, exist_ok=True)
    (out / f"{stem}.md").write_text(text, encoding="utf-8")
    (out / f"{stem}.json").write_text(json.dumps(runs, indent=2) + "\n", encoding="utf-8")
    if len(counts) > 1:
        plot(teacher, runs, counts, out / f"{stem}.png")
    print(text)


def median_load(runs: dict[str, list[dict[str, Any]]], name: str, streams: int, key: str) -> float:
    """A setting's median over its rounds of one figure of one stream count's load."""
    return statistics.median(r["loads"][streams][key] for r in runs[name])


def plot(teacher: str, runs: dict[str, list[dict[str, Any]]], counts: list[int], out: Path) -> None:
    """Each drafting setting's tokens/s over the teacher alone's, per stream count."""
    title, xlabel, ylabel = (
        f"Speculative decoding: {teacher}",
        "concurrent streams",
        "tokens/s, x the teacher alone",
    )
    with saved_axes(out, (6, 3.6), title, xlabel, ylabel) as axis:
        for name in [n for n in runs if n != "off"]:
            alone = [median_load(runs, "off", n, "tokens_per_s") for n in counts]
            drafted = [median_load(runs, name, n, "tokens_per_s") for n in counts]
            axis.plot(counts, [a / b for a, b in zip(drafted, alone, strict=True)], marker="o", label=name)
        axis.axhline(1.0, color="grey", linewidth=0.8)
        axis.set_xscale("log", base=2)
        axis.set_xticks(counts, [str(n) for n in counts])


def report(
    teacher: str,
    runs: dict[str, list[dict[str, Any]]],
    counts: list[int],
    rounds: int,
    seconds: float,
    new_tokens: int,
    source_of_prompts: str = REVIEWS,
) -> str:
    def median(name: str, n: int, key: str) -> float:
        return median_load(runs, name, n, key)

    reference = runs["off"][0]["texts"]
    lines = [
        f"# Speculative decoding: {teacher} drafted by its student",
        "",
        f"{rounds} alternating rounds, {seconds:g} s of load per stream count, {new_tokens} tokens a "
        f"request; medians. Prompts: {source_of_prompts}.",
        "",
        "| setting | "
        + " | ".join(f"{n} stream{'s' * (n > 1)} tokens/s (x off)" for n in counts)
        + " | "
        + " | ".join(f"TTFT p50 ms, {n} stream{'s' * (n > 1)}" for n in counts)
        + " | acceptance | tokens per teacher step | drafts a token | greedy texts = teacher's |",
        "|---|" + "---|" * (2 * len(counts) + 4),
    ]
    for name, results in runs.items():
        cells = []
        for n in counts:
            rate = median(name, n, "tokens_per_s")
            cells.append(f"{rate:,.0f} ({rate / median('off', n, 'tokens_per_s'):.2f}x)")
        cells += [f"{median(name, n, 'ttft_p50_ms'):.1f}" for n in counts]
        acceptance = [r["acceptance"] for r in results if r["acceptance"] is not None]
        per_check = [r["tokens_per_check"] for r in results if r["tokens_per_check"] is not None]
        per_token = [r["drafts_per_token"] for r in results if r.get("drafts_per_token") is not None]
        same = all(r["texts"] == reference for r in results)
        lines.append(
            f"| {name} | "
            + " | ".join(cells)
            + f" | {'-' if not acceptance else f'{statistics.median(acceptance):.2f}'}"
            + f" | {'-' if not per_check else f'{statistics.median(per_check):.2f}'}"
            + f" | {'-' if not per_token else f'{statistics.median(per_token):.2f}'}"
            + f" | {'yes' if same else 'NO'} ({len(reference)} prompts) |"
        )
    return "\n".join([*lines, "", *by_round(runs, counts)]) + "\n"


def by_round(runs: dict[str, list[dict[str, Any]]], counts: list[int]) -> list[str]:
    """Each setting's x off in each round (a round's servers ran back to back: its ratio is the one the
    machine's drift touches least), and how many requests the teacher alone finished at each stream count:
    the load draws its prompts with the same seed for every server, so few requests are few prompts."""
    lines = ["By round, x off:", ""]
    for name, results in list(runs.items())[1:]:
        for n in counts:
            ratios = [
                r["loads"][n]["tokens_per_s"] / off["loads"][n]["tokens_per_s"]
                for r, off in zip(results, runs["off"], strict=False)
            ]
            lines.append(f"- {name}, {_streams(n)}: " + " / ".join(f"{x:.2f}x" for x in ratios))
    requests = []
    for n in counts:
        finished = statistics.median(r["loads"][n].get("requests", 0) for r in runs["off"])
        requests.append(f"{_streams(n)}: {finished:g}")
    return [*lines, "", "Requests a server finished alone (median): " + ", ".join(requests) + "."]


def _streams(n: int) -> str:
    return f"{n} stream{'s' * (n > 1)}"


if __name__ == "__main__":
    app()
