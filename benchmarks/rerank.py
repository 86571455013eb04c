"""Reranking served: each SQuAD question against its article's paragraphs, through /v1/rerank.

    python -m benchmarks.rerank --repository build/real/rerank/models --model minilm \\
        --squad ../shared/data/squad_v1.1_part_a.json --out docs/bench
    python -m benchmarks.rerank --repository build/real/rerank/models --model minilm \\
        --squad build/real/rerank/data/eval-squad.json --ranker ranker-teacher --ranker ranker --candidates 10

Without `--ranker`, the embedding model alone and its passage cache:
1. Quality: recall@1 of the gold paragraph over every question, the served graph's ranking; the
   sentence-embeddings section's PyTorch figure over the same questions is the reference.
2. Speed: `--speed-questions` questions sent by `--connections` clients at once (closed loop), on a fresh
   server with the passage cache off (every paragraph embedded with every question) and on one with it on and
   warmed by a first pass (an article's paragraphs embedded once, then looked up); questions/s, p50 and p99,
   and the tokens embedded a question (`usage`).
With `--ranker` (cross-encoders, e.g. a teacher and its distilled student), retrieve then rerank: the
embedding model's best `--candidates` paragraphs, then each ranker's best of those; recall@1 of each stage
(and of the candidates: the most a reranker can reach), and each ranker's questions/s on the same
candidates, side by side.
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


ENV = {"DISTILSERVE_MAX_CLIENT_BATCH": "128"}


def body(model: str, question: Question, top_n: int = 1) -> str:
    return json.dumps(
        {"model": model, "query": question.text, "documents": question.paragraphs, "top_n": top_n}
    )


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


def cache_study(repository: Path, model: str, questions: list[Question], connections: int, speed: int) -> str:
    bodies = [body(model, q) for q in questions]
    timed = bodies[:speed]
    with serve(repository, {**ENV, "DISTILSERVE_PASSAGE_CACHE": "0"}) as base:
        cold = closed_loop(base, timed, connections, "cache off")
    with serve(repository, ENV) as base:
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
    return "\n".join(lines)


def two_stage(
    repository: Path, model: str, rankers: list[str], questions: list[Question], connections: int, k: int
) -> str:
    """The embedding model's best k paragraphs, then each ranker's best of those."""
    with serve(repository, ENV) as base:
        first = closed_loop(base, [body(model, q, k) for q in questions], connections, f"{model}: top {k}")
        candidates = [[r["index"] for r in a["results"]] for a in first["answers"]]
        runs = {}
        for ranker in rankers:
            bodies = [
                json.dumps(
                    {"model": ranker, "query": q.text, "documents": [q.paragraphs[i] for i in c], "top_n": 1}
                )
                for q, c in zip(questions, candidates, strict=True)
            ]
            runs[ranker] = closed_loop(base, bodies, connections, f"{ranker}: rerank {k}")
    golds = [q.gold for q in questions]
    n = len(questions)
    retrieved = sum(c[0] == g for c, g in zip(candidates, golds, strict=True))
    reachable = sum(g in c for c, g in zip(candidates, golds, strict=True))
    lines = [
        f"# Retrieve, then rerank: {model}'s best {k} paragraphs, reranked",
        "",
        f"{n:,} questions against their article's paragraphs; `/v1/rerank`, {connections} clients at once.",
        "",
        "| stage | recall@1 | questions/s | p50 ms | p99 ms |",
        "|---|---|---|---|---|",
        f"| {model} alone (cosine) | {retrieved / n:.4f} | {first['qps']:,.1f} | {first['p50_ms']:.1f} | "
        f"{first['p99_ms']:.1f} |",
        f"| its best {k} hold the gold paragraph (what a reranker can reach) | {reachable / n:.4f} | | | |",
    ]
    for ranker, run in runs.items():
        hits = sum(
            c[a["results"][0]["index"]] == g
            for a, c, g in zip(run["answers"], candidates, golds, strict=True)
        )
        lines.append(
            f"| {ranker} reranking them | **{hits / n:.4f}** | {run['qps']:,.1f} | {run['p50_ms']:.1f} | "
            f"{run['p99_ms']:.1f} |"
        )
    if len(runs) == 2:
        (a, ra), (b, rb) = runs.items()
        lines += ["", f"{b} ÷ {a}, questions/s reranking: {rb['qps'] / ra['qps']:.2f}x."]
    return "\n".join([*lines, ""])


@app.command()
def main(
    repository: Annotated[Path, typer.Option(help="Model repository holding the embedding model.")],
    model: Annotated[str, typer.Option(help="The embedding model.")],
    squad: Annotated[Path, typer.Option(help="SQuAD v1.1 JSON.")],
    ranker: Annotated[
        list[str] | None, typer.Option(help="Cross-encoders reranking the best candidates.")
    ] = None,
    candidates: Annotated[int, typer.Option(min=1)] = 10,
    connections: Annotated[int, typer.Option(min=1)] = 8,
    speed_questions: Annotated[int, typer.Option(min=1)] = 400,
    out: Annotated[Path, typer.Option()] = Path("docs/bench"),
) -> None:
    questions = squad_questions(squad)
    if ranker:
        text = two_stage(repository, model, ranker, questions, connections, candidates)
        name = f"rerank-{model}-{'-'.join(ranker)}.md"
    else:
        text = cache_study(repository, model, questions, connections, speed_questions)
        name = f"rerank-{model}.md"
    out.mkdir(parents=True, exist_ok=True)
    (out / name).write_text(text, encoding="utf-8")
    print(text)


if __name__ == "__main__":
    app()
