"""Long prompts scored as lm-evaluation-harness scores them: engine-core memory and time per prefill budget.

    python -m benchmarks.long_prompts --repository build/real/smollm2/models --model smollm2-teacher \\
        --budgets 1000000,8192,2048,512 --prompts 4 --tokens 2048

One fresh server per `DISTILSERVE_GEN_PREFILL_TOKENS` budget (the first, larger than any request, is one
prefill call for all prompts, as before chunking): `--rounds` requests of `--prompts` prompts of `--tokens`
token ids each, cut from `--text` in order, with `echo`, `logprobs: 1` and `max_tokens: 0` (a rolling
log-likelihood window). Reports the engine core's RSS when ready and after the requests (ONNX Runtime's
arena keeps the largest call's memory), seconds per request, and the sum of the prompts' log-probabilities,
which must not depend on the budget. Writes OUT/long-prompts-MODEL.{md,json}.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
import typer

from benchmarks.servers import SERVER_PIDS, serve
from common.cli import line_console
from loadtests.process_memory import sample_tree

app = typer.Typer(add_completion=False)


def engine_core_rss(server_pid: int) -> int:
    """The engine core's (the process that holds the models) RSS, MiB."""
    return round(sum(p.rss_mib for p in sample_tree(server_pid) if p.name.startswith("ds-engine-core")))


def prompts_from(base: str, model: str, text: str, count: int, tokens: int) -> list[list[int]]:
    """`count` prompts of `tokens` ids each, from the start of `text` on, by the server's tokenizer."""
    chars = text[: count * tokens * 8]  # ~4 characters a token: room to spare
    reply = httpx.post(f"{base}/tokenize", json={"model": model, "prompt": chars}, timeout=120)
    reply.raise_for_status()
    ids = reply.json()["tokens"]
    if len(ids) < count * tokens:
        raise typer.BadParameter(f"the text holds {len(ids)} tokens: fewer than {count} x {tokens}")
    return [ids[i * tokens : (i + 1) * tokens] for i in range(count)]


# The options of a benchmark over prefill budgets (this one's and benchmarks.prefill_stall's).
REPOSITORY = typer.Option(..., "--repository", exists=True, file_okay=False)
MODEL = typer.Option(..., "--model", help="A text-generation model of the repository.")
TEXT = typer.Option(Path("../shared/data/wikitext2_raw_valid.txt"), "--text", exists=True, dir_okay=False)
OUT = typer.Option(Path("docs/bench"), "--out", help="Directory of the report.")


def budget_env(budget: int, text: str) -> dict[str, str]:
    """A server of one prefill budget, the model alone, taking requests as long as `text`."""
    return {
        "DISTILSERVE_GEN_PREFILL_TOKENS": str(budget),
        "DISTILSERVE_SPECULATIVE": "off",
        "DISTILSERVE_MAX_BODY_BYTES": "16000000",
        "DISTILSERVE_MAX_TEXT_CHARS": str(max(100_000, len(text))),
    }


def measured_budgets(
    label: str, budgets: str, measure_one: Callable[[int], dict[str, Any]]
) -> list[dict[str, Any]]:
    """`measure_one` of each budget of the comma list, in order, each announced."""
    console = line_console()
    rows = []
    for budget in (int(b) for b in budgets.split(",")):
        console.print(f"{label}: budget {budget:,}")
        rows.append(measure_one(budget))
    return rows


def write_report(stem: Path, report: str, rows: list[dict[str, Any]]) -> None:
    """STEM.md and STEM.json, and the table printed."""
    stem.parent.mkdir(parents=True, exist_ok=True)
    stem.with_suffix(".md").write_text(report)
    stem.with_suffix(".json").write_text(json.dumps(rows, indent=2) + "\n")
    line_console().print(report, soft_wrap=True)


def measure(
    repository: Path, model: str, budget: int, text: str, prompts: int, tokens: int, rounds: int
) -> dict[str, Any]:
    with serve(repository, budget_env(budget, text)) as base:
        batch = prompts_from(base, model, text, prompts, tokens)
        ready = engine_core_rss(SERVER_PIDS[base])
        body = {"model": model, "prompt": batch, "max_tokens": 0, "echo": True, "logprobs": 1}
        seconds, sums = [], []
        for _ in range(rounds):
            started = time.perf_counter()
            reply = httpx.post(f"{base}/v1/completions", json=body, timeout=1800)
            seconds.append(time.perf_counter() - started)
            reply.raise_for_status()
            choices = reply.json()["choices"]
            sums.append(sum(x for c in choices for x in c["logprobs"]["token_logprobs"] if x is not None))
        after = engine_core_rss(SERVER_PIDS[base])
    return {
        "budget": budget,
        "rss_ready_mib": ready,
        "rss_after_mib": after,
        "seconds": seconds,
        "logprob_sum": sums,
    }


def render(model: str, prompts: int, tokens: int, rows: list[dict[str, Any]]) -> str:
    lines = [
        f"# Long prompts: {model}, {prompts} prompts x {tokens} tokens a request (echo, max_tokens 0)",
        "",
        "| prefill budget (positions a call) | engine core RSS ready | after | seconds a request (min) "
        "| sum of log-probabilities |",
        "|---|---|---|---|---|",
    ]
    for row in rows:
        lines.append(
            f"| {row['budget']:,} | {row['rss_ready_mib']:,} MiB | {row['rss_after_mib']:,} MiB "
            f"| {min(row['seconds']):.2f} | {row['logprob_sum'][0]:.3f} |"
        )
    return "\n".join(lines) + "\n"


@app.command()
def main(
    repository: Path = REPOSITORY,
    model: str = MODEL,
    budgets: str = typer.Option("1000000,2048,512", "--budgets", help="Comma list of prefill budgets."),
    prompts: int = typer.Option(4, "--prompts", min=1),
    tokens: int = typer.Option(2048, "--tokens", min=2),
    rounds: int = typer.Option(3, "--rounds", min=1),
    text: Path = TEXT,
    out: Path = OUT,
) -> None:
    source = text.read_text()
    rows = measured_budgets(
        "long-prompts",
        budgets,
        lambda budget: measure(repository, model, budget, source, prompts, tokens, rounds),
    )
    write_report(out / f"long-prompts-{model}", render(model, prompts, tokens, rows), rows)


if __name__ == "__main__":
    app()
