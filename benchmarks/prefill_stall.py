"""Running streams while a long prompt joins them: how long they wait between tokens, per prefill budget.

    python -m benchmarks.prefill_stall --repository build/real/smollm2/models --model smollm2-teacher \\
        --budgets 1000000,512,128 --streams 2 --tokens 2048

One fresh server per `DISTILSERVE_GEN_PREFILL_TOKENS` budget. `--streams` clients stream /v1/generate
(ignore_eos, back to back) and, once each has its first tokens, one prompt of `--tokens` token ids (cut
from `--text` by the server's tokenizer) is sent to /v1/completions for one token, and half a second later
a short one. A budget past the long prompt's length is one prefill call, which the streams wait for whole;
a smaller one is a chunk a step between their decode steps, and the short prompt joins beside it. Reports
per budget the streams' longest gap between two tokens while the long prompt was prefilled, their median
gap before it came, and the time each prompt took to its answer; a plot of every gap over time beside the
table.
Writes OUT/prefill-stall-MODEL.{md,json,png}.
"""

from __future__ import annotations

import itertools
import statistics
import threading
import time
from pathlib import Path
from typing import Any

import httpx
import typer

from benchmarks.long_prompts import (
    MODEL,
    OUT,
    REPOSITORY,
    TEXT,
    budget_env,
    measured_budgets,
    prompts_from,
    write_report,
)
from benchmarks.plots import saved_axes
from benchmarks.servers import serve

app = typer.Typer(add_completion=False)
WARM_TOKENS = 8  # each stream's tokens before the long prompt is sent
SHORT_AFTER_S = 0.5  # a short prompt follows the long one this much later


def answer(base: str, model: str, prompt: str | list[int]) -> None:
    """One completion of one token (raises on an error answer)."""
    body = {"model": model, "prompt": prompt, "max_tokens": 1}
    httpx.post(f"{base}/v1/completions", json=body, timeout=1800).raise_for_status()


def stream_tokens(base: str, model: str, new_tokens: int, times: list[float], stop: threading.Event) -> None:
    """Streamed requests back to back, their tokens' arrival times, until `stop` (the client then leaves)."""
    body = {
        "model": model,
        "prompt": "The history of the city begins",
        "max_new_tokens": new_tokens,
        "ignore_eos": True,
        "stream": True,
    }
    while not stop.is_set():
        with httpx.stream("POST", f"{base}/v1/generate", json=body, timeout=600) as reply:
            reply.raise_for_status()
            for line in reply.iter_lines():
                if line.startswith("data:") and '"token"' in line:
                    times.append(time.perf_counter())
                if stop.is_set():
                    return


def measure(
    repository: Path, model: str, budget: int, text: str, streams: int, tokens: int, stream_tokens_each: int
) -> dict[str, Any]:
    with serve(repository, budget_env(budget, text)) as base:
        [prompt] = prompts_from(base, model, text, 1, tokens)
        stop = threading.Event()
        times: list[list[float]] = [[] for _ in range(streams)]
        clients = [
            threading.Thread(
                target=stream_tokens, args=(base, model, stream_tokens_each, t, stop), daemon=True
            )
            for t in times
        ]
        for client in clients:
            client.start()
        while min(len(t) for t in times) < WARM_TOKENS:
            time.sleep(0.05)
        sent = time.perf_counter()
        long_reply = threading.Thread(target=answer, args=(base, model, prompt), daemon=True)
        long_reply.start()
        time.sleep(SHORT_AFTER_S)
        short_sent = time.perf_counter()
        answer(base, model, "The capital of France is")
        short_answered = time.perf_counter()
        long_reply.join()
        answered = time.perf_counter()
        time.sleep(2.0)  # the streams' steps after it
        stop.set()
        for client in clients:
            client.join(timeout=60)
    gaps = [(b - sent, b - a) for t in times for a, b in itertools.pairwise(t)]
    before = [gap for at, gap in gaps if at < 0]
    during = [gap for at, gap in gaps if at >= 0 and at - gap <= answered - sent]
    return {
        "budget": budget,
        "longest_gap_s": max(during, default=0.0),
        "median_gap_before_s": statistics.median(before) if before else None,
        "prompt_answer_s": answered - sent,
        "short_prompt_answer_s": short_answered - short_sent,
        "gaps": gaps,
    }


def render(model: str, streams: int, tokens: int, rows: list[dict[str, Any]]) -> str:
    lines = [
        f"# Streams while a prompt joins: {model}, {streams} streams, one prompt of {tokens:,} tokens",
        "",
        "| prefill budget (positions a call) | streams' longest gap while it is prefilled | their median gap "
        f"before | the prompt answered after | a short prompt sent {SHORT_AFTER_S:g} s after it, answered "
        "after |",
        "|---|---|---|---|---|",
    ]
    for row in rows:
        before = row["median_gap_before_s"]
        lines.append(
            f"| {row['budget']:,} | {row['longest_gap_s']:.2f} s "
            f"| {'-' if before is None else f'{1000 * before:.0f} ms'} | {row['prompt_answer_s']:.2f} s "
            f"| {row['short_prompt_answer_s']:.2f} s |"
        )
    return "\n".join(lines) + "\n"


def plot(model: str, rows: list[dict[str, Any]], out: Path) -> None:
    title = f"{model}: running streams while a long prompt is prefilled"
    xlabel, ylabel = "seconds since the long prompt was sent", "gap before a stream's token (s)"
    with saved_axes(out, (8, 4), title, xlabel, ylabel) as axis:
        for row in rows:
            at, gap = zip(*row["gaps"], strict=True) if row["gaps"] else ((), ())
            label = f"budget {row['budget']:,} (answered at {row['prompt_answer_s']:.1f} s)"
            axis.plot(at, gap, ".", label=label)
        axis.axvline(0, color="grey", linewidth=0.8)


@app.command()
def main(
    repository: Path = REPOSITORY,
    model: str = MODEL,
    budgets: str = typer.Option("1000000,512,128", "--budgets", help="Comma list of prefill budgets."),
    streams: int = typer.Option(2, "--streams", min=1),
    tokens: int = typer.Option(2048, "--tokens", min=2),
    stream_tokens_each: int = typer.Option(
        1000, "--stream-tokens", min=1, help="Tokens of each streamed request (they run back to back)."
    ),
    text: Path = TEXT,
    out: Path = OUT,
) -> None:
    source = text.read_text()
    rows = measured_budgets(
        "prefill-stall",
        budgets,
        lambda budget: measure(repository, model, budget, source, streams, tokens, stream_tokens_each),
    )
    out.mkdir(parents=True, exist_ok=True)
    plot(model, rows, out / f"prefill-stall-{model}.png")
    write_report(out / f"prefill-stall-{model}", render(model, streams, tokens, rows), rows)


if __name__ == "__main__":
    app()
