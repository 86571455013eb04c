"""A chat model asked for JSON, with and without `response_format`: how often its answer parses and fits the
schema, and what the token masks cost in tokens/s and TTFT.

    python -m benchmarks.structured_output --repository build/real/smollm2/models --model smollm2-teacher \\
        --texts ../shared/data/wikitext2_raw_valid.txt --prompts 24 --streams 1,8

Every prompt asks for a passage's topic, tone and a year it names as a JSON object, the keys and values
spelled out in the question, so the model knows what is wanted without the schema. Three ways, on one server,
taking turns `--rounds` times: `instructed` (the question alone), `json_object` (response_format: any JSON
object) and `json_schema` (response_format: the schema below, every token masked to it). Greedy, at most
`--new-tokens` tokens an answer, streamed, each `--streams` count of clients at once over all prompts.
Reports per way and streams: the share of answers that parse as JSON, that fit the schema, and that
`--new-tokens` cut; completion tokens/s (answers of different lengths amortise their prompts differently),
TTFT p50, the time a token after the first (p50: prefills of other prompts between decode steps count
there), and the engine's mean decode step (from /metrics), where a mask's cost per step shows. Writes
OUT/structured-output-MODEL.{md,json,png}.
"""

from __future__ import annotations

import asyncio
import json
import statistics
import time
from pathlib import Path
from typing import Annotated, Any

import httpx
import typer
from rich.console import Console

from benchmarks.plots import saved_figure
from benchmarks.served_graphs import counts_of
from benchmarks.servers import serve
from benchmarks.streams import stream_chat
from common.cli import one_command_app
from common.progress import ProgressLog
from loadtests.texts import openings

console = Console(stderr=True)

TONES = ("positive", "negative", "neutral")
SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {
        "topic": {"type": "string", "maxLength": 60},
        "tone": {"type": "string", "enum": list(TONES)},
        "year": {"type": ["integer", "null"], "minimum": 0, "maximum": 2100},
    },
    "required": ["topic", "tone", "year"],
    "additionalProperties": False,
}
WAYS: dict[str, dict[str, Any] | None] = {
    "instructed": None,
    "json_object": {"type": "json_object"},
    "json_schema": {"type": "json_schema", "json_schema": {"name": "passage", "schema": SCHEMA}},
}
QUESTION = (
    'Read the passage and answer with a JSON object only, with three keys: "topic" (a few words), '
    '"tone" ("positive", "negative" or "neutral") and "year" (a year the passage names, as a number, '
    "or null).\n\nPassage: {passage}"
)

Answer = dict[str, Any]  # text, tokens, ttft_s, seconds


def fits(text: str) -> tuple[bool, bool]:
    """Whether the answer parses as JSON, and whether it fits SCHEMA."""
    try:
        value = json.loads(text)
    except ValueError:
        return False, False
    fit = (
        isinstance(value, dict)
        and set(value) == {"topic", "tone", "year"}
        and isinstance(value["topic"], str)
        and len(value["topic"]) <= 60
        and value["tone"] in TONES
        and (value["year"] is None or _year(value["year"]))
    )
    return True, fit


def _year(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and 0 <= value <= 2100


async def ask(client: httpx.AsyncClient, model: str, passage: str, way: str, new_tokens: int) -> Answer:
    body: dict[str, Any] = {
        "model": model,
        "messages": [{"role": "user", "content": QUESTION.format(passage=passage)}],
        "max_tokens": new_tokens,
        "temperature": 0,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    if WAYS[way] is not None:
        body["response_format"] = WAYS[way]
    answer = await stream_chat(client, body)
    return {
        "text": answer.text,
        "finish_reason": answer.finish_reason,
        "tokens": answer.usage["completion_tokens"],
        "ttft_s": answer.ttft_s,
        "seconds": answer.seconds,
    }


async def decode_steps(client: httpx.AsyncClient, model: str) -> tuple[float, float]:
    """The engine's decode steps so far for `model`: (seconds, count), from /metrics (masks included: a
    grammar's are computed inside the step, where its tokens are chosen)."""
    text = (await client.get("/metrics")).text
    found = {"sum": 0.0, "count": 0.0}
    for line in text.splitlines():
        for kind in found:
            name = f"distilserve_generation_step_duration_seconds_{kind}{{"
            if line.startswith(name) and f'model="{model}"' in line and 'phase="decode"' in line:
                found[kind] += float(line.rsplit(" ", 1)[1])
    return found["sum"], found["count"]


async def load(base: str, model: str, passages: list[str], way: str, streams: int, new_tokens: int) -> Any:
    """Every passage asked once, `streams` clients at once; the answers, the wall time, the decode steps."""
    queue = list(enumerate(passages))
    answers: dict[int, Answer] = {}

    async def client_loop(client: httpx.AsyncClient) -> None:
        while queue:
            i, passage = queue.pop(0)
            answers[i] = await ask(client, model, passage, way, new_tokens)

    async with httpx.AsyncClient(base_url=base, timeout=600) as client:
        before = await decode_steps(client, model)
        started = time.perf_counter()
        await asyncio.gather(*(client_loop(client) for _ in range(streams)))
        wall = time.perf_counter() - started
        after = await decode_steps(client, model)
    return {
        "wall_s": wall,
        "decode_s": after[0] - before[0],
        "decode_steps": after[1] - before[1],
        "answers": [answers[i] for i in range(len(passages))],
    }


def summary(runs: list[dict[str, Any]]) -> dict[str, float]:
    answers = [a for run in runs for a in run["answers"]]
    parsed = [fits(a["text"]) for a in answers]
    later = [(a["seconds"] - a["ttft_s"]) / (a["tokens"] - 1) for a in answers if a["tokens"] > 1]
    return {
        "tokens_per_s": sum(a["tokens"] for a in answers) / sum(run["wall_s"] for run in runs),
        "ttft_p50_ms": 1000 * statistics.median(a["ttft_s"] for a in answers),
        "itl_p50_ms": 1000 * statistics.median(later) if later else float("nan"),
        "tokens_p50": statistics.median(a["tokens"] for a in answers),
        "parses": sum(p for p, _ in parsed) / len(parsed),
        "fits": sum(f for _, f in parsed) / len(parsed),
        "cut": sum(a["finish_reason"] == "length" for a in answers) / len(answers),
        "decode_step_ms": 1000
        * sum(r["decode_s"] for r in runs)
        / max(1, sum(r["decode_steps"] for r in runs)),
    }


def render(command: str, results: dict[str, dict[str, list[dict[str, Any]]]], example: dict[str, str]) -> str:
    lines = [
        "# Asked for JSON, with and without response_format (python -m benchmarks.structured_output)",
        "",
        f"`{command}`",
        "",
        "| way | streams | answers parse as JSON | fit the schema | cut at --new-tokens "
        "| tokens an answer (p50) | tokens/s | TTFT p50 ms | ms a token after the first (p50) "
        "| engine decode step ms (mean) |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for way, by_streams in results.items():
        for streams, runs in by_streams.items():
            s = summary(runs)
            lines.append(
                f"| {way} | {streams} | {s['parses']:.0%} | {s['fits']:.0%} | {s['cut']:.0%} | "
                f"{s['tokens_p50']:.0f} | {s['tokens_per_s']:.1f} | {s['ttft_p50_ms']:.0f} | "
                f"{s['itl_p50_ms']:.1f} | {s['decode_step_ms']:.1f} |"
            )
    lines += ["", "The first prompt's answer each way:", ""]
    lines += [f"- {way}: `{text}`" for way, text in example.items()]
    return "\n".join(lines) + "\n"


def plot(path: Path, results: dict[str, dict[str, list[dict[str, Any]]]]) -> None:
    with saved_figure(path, (9.0, 3.6), columns=2) as (fit_ax, speed_ax):
        ways = list(results)
        streams = list(next(iter(results.values())))
        width = 0.8 / len(streams)
        for j, n in enumerate(streams):
            xs = [i + j * width for i in range(len(ways))]
            speed_ax.bar(
                xs, [summary(results[w][n])["tokens_per_s"] for w in ways], width, label=f"{n} streams"
            )
        fit_ax.bar(range(len(ways)), [100 * summary(results[w][streams[0]])["fits"] for w in ways])
        for ax in (fit_ax, speed_ax):
            ax.set_xticks([i + (0 if ax is fit_ax else 0.4 - width / 2) for i in range(len(ways))], ways)
        fit_ax.set_ylabel("answers that fit the schema, %")
        speed_ax.set_ylabel("completion tokens/s")
        speed_ax.legend(fontsize=8)


def main(
    repository: Annotated[
        Path, typer.Option(help="Model repository holding --model (with a chat template).")
    ],
    model: Annotated[str, typer.Option(help="The chat model's name.")],
    texts: Annotated[Path, typer.Option(help="Passages: openings of this text file's paragraphs.")],
    prompts: Annotated[int, typer.Option(min=1, help="Passages asked about.")] = 24,
    words: Annotated[int, typer.Option(min=1, help="Words a passage.")] = 60,
    streams: Annotated[str, typer.Option(help="Comma list of clients at once.")] = "1,8",
    new_tokens: Annotated[int, typer.Option(min=1, help="Most tokens an answer (greedy).")] = 64,
    rounds: Annotated[int, typer.Option(min=1, help="Rounds of every way, taking turns.")] = 2,
    out: Annotated[Path, typer.Option(help="Directory of the report.")] = Path("docs/bench"),
) -> None:
    """JSON asked of a chat model three ways on one server: fit rate and speed."""
    if not (repository / model).is_dir():
        raise typer.BadParameter(f"no {model} in {repository}", param_hint="--model")
    counts = [int(n) for n in counts_of(streams, "--streams", 1)]
    if not counts:
        raise typer.BadParameter("one count at least", param_hint="--streams")
    passages = openings(texts, prompts, words=words, seed=23)
    results: dict[str, dict[str, list[dict[str, Any]]]] = {w: {str(n): [] for n in counts} for w in WAYS}
    with serve(repository, {}) as base:
        asyncio.run(load(base, model, passages[:2], "json_schema", 2, 8))  # warm-up: masks, tokenizer
        with ProgressLog(
            "structured output", rounds * len(WAYS) * len(counts), unit="runs", active=True
        ) as bar:
            for _ in range(rounds):
                for n in counts:
                    for way in WAYS:
                        bar.update(status=f"{way}, {n} streams")
                        run = asyncio.run(load(base, model, passages, way, n, new_tokens))
                        results[way][str(n)].append(run)
                        bar.update(advance=1)
    example = {way: results[way][str(counts[0])][0]["answers"][0]["text"] for way in WAYS}
    command = (
        f"python -m benchmarks.structured_output --repository {repository} --model {model} --texts {texts} "
        f"--prompts {prompts} --words {words} --streams {streams} --new-tokens {new_tokens} --rounds {rounds}"
    )
    out.mkdir(parents=True, exist_ok=True)
    stem = out / f"structured-output-{model}"
    report = render(command, results, example)
    stem.with_suffix(".md").write_text(report)
    stem.with_suffix(".json").write_text(json.dumps({"command": command, "results": results}, indent=2))
    plot(stem.with_suffix(".png"), results)
    console.print(report)


app = one_command_app(main, help=__doc__)

if __name__ == "__main__":
    app()
