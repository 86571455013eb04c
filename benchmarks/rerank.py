"""Reranking served: each SQuAD question against its article's paragraphs, through /v1/rerank.

    python -m benchmarks.rerank --repository build/real/rerank/models --model minilm \\
        --squad ../shared/data/squad_v1.1_part_a.json --out docs/bench

1. Quality: recall@1 of the gold paragraph over every question, the served graph's ranking; the
   sentence-embeddings section's PyTorch figure over the same questions is the reference.
2. Speed: `--speed-questions` questions sent by `--connections` clients at once (closed loop), on a fresh
   server with the passage cache off (every paragraph embedded with every question) and on one with it on and
   warmed by a first pass (an article's paragraphs embedded once, then looked up); questions/s, p50 and p99,
   and the tokens embedded a question (`usage`).
Each server takes up to 128 texts a request (the longest article has 98 paragraphs).
"""

from __future__ import annotations

import asyncio
import json
import statistics
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any

import typer

from benchmarks.open_loop import http_exchange, raw_post
from benchmarks.servers import serve
from common.cli import cli_app
from common.progress import ProgressLog

app = cli_app(help=__doc__)


@dataclass(frozen=True)
class Question:
    text: str
    paragraphs: list[str]  # its article's
    gold: int  # the paragraph it was asked of


def squad_questions(path: Path) -> list[Question]:
    questions = []
    for article in json.loads(path.read_text(encoding="utf-8"))["data"]:
        paragraphs = [p["context"] for p in article["paragraphs"]]
        for gold, paragraph in enumerate(article["paragraphs"]):
            questions += [Question(qa["question"], paragraphs, gold) for qa in paragraph["qas"]]
    return questions


def body(model: str, question: Question) -> str:
    return json.dumps({"model": model, "query": question.text, "documents": question.paragraphs, "top_n": 1})


async def _closed_loop(
    base: str, bodies: list[str], connections: int, progress: ProgressLog
) -> dict[str, Any]:
    """Every body once, `connections` at a time: each answer, and the latencies."""
    host, port = base.removeprefix("http://").split(":")
    queue: asyncio.Queue[int] = asyncio.Queue()
    for i in range(len(bodies)):
        queue.put_nowait(i)
    answers: list[Any] = [None] * len(bodies)
    latencies: list[float] = []

    async def client() -> None:
        connection = await asyncio.open_connection(host, int(port))
        while not queue.empty():
            i = queue.get_nowait()
            started = time.perf_counter()
            status, data = await http_exchange(*connection, raw_post(host, "/v1/rerank", bodies[i]))
            latencies.append(time.perf_counter() - started)
            if status != 200:
                raise RuntimeError(f"/v1/rerank answered {status}: {data[:300]!r}")
            answers[i] = json.loads(data)
            progress.update(advance=1)
        connection[1].close()

    started = time.perf_counter()
    await asyncio.gather(*(client() for _ in range(connections)))
    wall = time.perf_counter() - started
    ordered = sorted(latencies)
    return {
        "answers": answers,
        "qps": len(bodies) / wall,
        "p50_ms": 1000 * statistics.median(ordered),
        "p99_ms": 1000 * ordered[min(len(ordered) - 1, int(0.99 * len(ordered)))],
    }


def closed_loop(base: str, bodies: list[str], connections: int, what: str) -> dict[str, Any]:
    with ProgressLog(what, len(bodies), unit="questions") as progress:
        return asyncio.run(_closed_loop(base, bodies, connections, progress))


def tokens_each(answers: list[Any]) -> float:
    return statistics.mean(a["usage"]["total_tokens"] for a in answers)


@app.command()
def main(
    repository: Annotated[Path, typer.Option(help="Model repository holding the embedding model.")],
    model: Annotated[str, typer.Option()],
    squad: Annotated[Path, typer.Option(help="SQuAD v1.1 JSON.")],
    connections: Annotated[int, typer.Option(min=1)] = 8,
    speed_questions: Annotated[int, typer.Option(min=1)] = 400,
    out: Annotated[Path, typer.Option()] = Path("docs/bench"),
) -> None:
    questions = squad_questions(squad)
    bodies = [body(model, q) for q in questions]
    timed = bodies[:speed_questions]
    env = {"DISTILSERVE_MAX_CLIENT_BATCH": "128"}
    with serve(repository, {**env, "DISTILSERVE_PASSAGE_CACHE": "0"}) as base:
        cold = closed_loop(base, timed, connections, "cache off")
    with serve(repository, env) as base:
        first = closed_loop(base, bodies, connections, "every question, cache on")
        warm = closed_loop(base, timed, connections, "cache warm")
    hits = sum(a["results"][0]["index"] == q.gold for a, q in zip(first["answers"], questions, strict=True))
    paragraphs = statistics.mean(len(q.paragraphs) for q in questions)
    lines = [
        f"# Rerank served: {model}, SQuAD questions against their article's paragraphs",
        "",
        f"{len(questions):,} questions, {paragraphs:.1f} paragraphs each on average; `/v1/rerank`, "
        f"`top_n` 1, {connections} clients at once.",
        "",
        f"**recall@1 of the gold paragraph: {hits / len(questions):.4f}** ({hits:,} of {len(questions):,}).",
        "",
        "| passage cache | questions | questions/s | p50 ms | p99 ms | tokens embedded a question |",
        "|---|---|---|---|---|---|",
    ]
    for name, run, count in (
        ("off", cold, len(timed)),
        ("on, first pass (each article's paragraphs embedded once)", first, len(bodies)),
        ("on, warm", warm, len(timed)),
    ):
        lines.append(
            f"| {name} | {count:,} | {run['qps']:,.1f} | {run['p50_ms']:.1f} | {run['p99_ms']:.1f} | "
            f"{tokens_each(run['answers']):,.0f} |"
        )
    lines += ["", f"Warm cache ÷ cache off, questions/s: {warm['qps'] / cold['qps']:.1f}x.", ""]
    text = "\n".join(lines)
    out.mkdir(parents=True, exist_ok=True)
    (out / f"rerank-{model}.md").write_text(text, encoding="utf-8")
    print(text)


if __name__ == "__main__":
    app()
