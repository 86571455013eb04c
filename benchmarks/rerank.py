"""Reranking served: each SQuAD question against its article's paragraphs, through /v1/rerank.

    python -m benchmarks.rerank --repository build/real/rerank/models --model minilm \\
        --squad ../shared/data/squad_v1.1_part_a.json --out docs/bench
    python -m benchmarks.rerank --repository build/real/rerank/models --model minilm \\
        --squad build/real/rerank/data/eval-squad.json \\
        --ranker ranker-teacher --ranker ranker:0 --ranker ranker

Without `--ranker`, the embedding model alone and its passage cache:
1. Quality: recall@1 of the gold paragraph over every question, the served graph's ranking; the
   sentence-embeddings section's PyTorch figure over the same questions is the reference.
2. Speed: `--connections` clients at once (closed loop): `--speed-questions` questions on a fresh server with
   the passage cache off (every paragraph embedded with every question), and every question twice on one
   with it on, the first pass warming it (an article's paragraphs embedded once, then looked up);
   questions/s, p50 and p99, and the tokens embedded a question (`usage`).
With `--ranker` (cross-encoders, e.g. a teacher and its distilled student), retrieve then rerank: the
embedding model's best `--candidates` paragraphs, then each ranker's best of those; recall@1 of each stage
(and of the candidates: the most a reranker can reach), and each ranker's questions/s on the same
candidates, side by side. `--ranker ranker:1.5` ranks with a request's `cascade_margin` (a student paired
with its teacher: the ranking cascade, service.ranking; `ranker:0`, the student alone), `--ranker ranker`
as served (its calibrated margin); each run's best paragraph is compared with the first ranker's.
`--teacher-documents`: an embedding student served with DISTILSERVE_EMBEDDING_DOCUMENTS=teacher (its
teacher embeds the paragraphs, the student the question). Each server takes up to 128 texts a request (the
longest article has 98 paragraphs).
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


def cache_study(
    repository: Path,
    model: str,
    questions: list[Question],
    connections: int,
    speed: int,
    teacher_documents: bool = False,
) -> str:
    bodies = [body(model, q) for q in questions]
    timed = bodies[:speed]
    env = {**ENV, "DISTILSERVE_EMBEDDING_DOCUMENTS": "teacher" if teacher_documents else "own"}
    with serve(repository, {**env, "DISTILSERVE_PASSAGE_CACHE": "0"}) as base:
        cold = closed_loop(base, timed, connections, "cache off")
    with serve(repository, env) as base:
        first = closed_loop(base, bodies, connections, "every question, cache on")
        warm = closed_loop(base, bodies, connections, "cache warm")
    hits = sum(a["results"][0]["index"] == q.gold for a, q in zip(first["answers"], questions, strict=True))
    paragraphs = statistics.mean(len(q.paragraphs) for q in questions)
    by = " (paragraphs embedded by its teacher: DISTILSERVE_EMBEDDING_DOCUMENTS=teacher)" * teacher_documents
    lines = [
        f"# Rerank served: {model}{by}, SQuAD questions against their article's paragraphs",
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
        ("on, warm (every question again)", warm, len(bodies)),
    ):
        lines.append(
            f"| {name} | {count:,} | {run['qps']:,.1f} | {run['p50_ms']:.1f} | {run['p99_ms']:.1f} | "
            f"{tokens_each(run['answers']):,.0f} |"
        )
    lines += ["", f"Warm cache ÷ cache off, questions/s: {warm['qps'] / cold['qps']:.1f}x.", ""]
    return "\n".join(lines)


def ranker_spec(spec: str) -> tuple[str, float | None]:
    """`name` (as served: a pair's student ranks by its calibrated cascade) or `name:margin` (a request's
    `cascade_margin`; 0: the student alone)."""
    name, _, margin = spec.partition(":")
    return name, float(margin) if margin else None


def two_stage(
    repository: Path, model: str, rankers: list[str], questions: list[Question], connections: int, k: int
) -> tuple[str, list[dict[str, Any]]]:
    """The embedding model's best k paragraphs, then each ranker's order of those: recall@1, agreement of
    its best with the first ranker's, the share of documents a pair's teacher scored, and speed."""
    with serve(repository, ENV) as base:
        first = closed_loop(base, [body(model, q, k) for q in questions], connections, f"{model}: top {k}")
        candidates = [[r["index"] for r in a["results"]] for a in first["answers"]]
        runs = {}
        for spec in rankers:
            name, margin = ranker_spec(spec)
            extra = {} if margin is None else {"cascade_margin": margin}
            bodies = [
                json.dumps(
                    {"model": name, "query": q.text, "documents": [q.paragraphs[i] for i in c], "top_n": 0}
                    | extra
                )
                for q, c in zip(questions, candidates, strict=True)
            ]
            runs[spec] = closed_loop(base, bodies, connections, f"{spec}: rerank {k}")
    golds = [q.gold for q in questions]
    n = len(questions)
    retrieved = sum(c[0] == g for c, g in zip(candidates, golds, strict=True))
    reachable = sum(g in c for c, g in zip(candidates, golds, strict=True))
    reference = [a["results"][0]["index"] for a in next(iter(runs.values()))["answers"]]
    rows = []
    for spec, run in runs.items():
        best = [a["results"][0]["index"] for a in run["answers"]]
        name, _ = ranker_spec(spec)
        scored = [r["model"] for a in run["answers"] for r in a["results"]]
        rows.append(
            {
                "ranker": spec,
                "recall_at_1": sum(c[b] == g for b, c, g in zip(best, candidates, golds, strict=True)) / n,
                "agreement": sum(b == r for b, r in zip(best, reference, strict=True)) / n,
                "read_again": sum(m != name for m in scored) / len(scored),
                "qps": run["qps"],
                "p50_ms": run["p50_ms"],
                "p99_ms": run["p99_ms"],
            }
        )
    lines = [
        f"# Retrieve, then rerank: {model}'s best {k} paragraphs, reranked",
        "",
        f"{n:,} questions against their article's paragraphs; `/v1/rerank`, {connections} clients at once. "
        f"A ranker `name:m` ranks with `cascade_margin` m (0: the student alone); `name` alone as served "
        f"(a pair's student: its calibrated margin). Agreement: its best paragraph is {rankers[0]}'s; "
        "read again: the share of paragraphs its teacher scored.",
        "",
        "| stage | recall@1 | agreement | read again | questions/s | p50 ms | p99 ms |",
        "|---|---|---|---|---|---|---|",
        f"| {model} alone (cosine) | {retrieved / n:.4f} | | | {first['qps']:,.1f} | {first['p50_ms']:.1f} | "
        f"{first['p99_ms']:.1f} |",
        f"| its best {k} hold the gold paragraph (the most a reranker reaches) | {reachable / n:.4f} |"
        " | | | | |",
    ]
    for row in rows:
        lines.append(
            f"| {row['ranker']} reranking them | **{row['recall_at_1']:.4f}** | {row['agreement']:.2%} | "
            f"{row['read_again']:.1%} | {row['qps']:,.1f} | {row['p50_ms']:.1f} | {row['p99_ms']:.1f} |"
        )
    lines += [
        "",
        f"Questions/s ÷ {rows[0]['ranker']}'s: "
        + ", ".join(f"{row['ranker']} {row['qps'] / rows[0]['qps']:.2f}x" for row in rows[1:])
        + ".",
    ]
    return "\n".join([*lines, ""]), rows


def plot_rankers(rows: list[dict[str, Any]], path: Path, title: str) -> None:
    """Recall@1 against questions/s, one point per ranker (the cascade's margins joined by a line)."""
    from benchmarks.plots import saved_axes

    with saved_axes(path, (6.4, 4.2), title, "questions/s", "recall@1 of the gold paragraph") as ax:
        swept = [r for r in rows if ":" in r["ranker"]]
        if len(swept) > 1:
            swept.sort(key=lambda r: r["qps"])
            ax.plot([r["qps"] for r in swept], [r["recall_at_1"] for r in swept], color="tab:blue", alpha=0.5)
        for row in rows:
            ax.scatter([row["qps"]], [row["recall_at_1"]], label=row["ranker"])


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
    teacher_documents: Annotated[
        bool, typer.Option(help="An embedding student's paragraphs embedded by its teacher, the query by it.")
    ] = False,
) -> None:
    questions = squad_questions(squad)
    if ranker:
        text, rows = two_stage(repository, model, ranker, questions, connections, candidates)
        stem = f"rerank-{model}-{'-'.join(dict.fromkeys(ranker_spec(r)[0] for r in ranker))}"
        name = f"{stem}.md"
        out.mkdir(parents=True, exist_ok=True)
        plot_rankers(rows, out / f"{stem}.png", f"{model}'s best {candidates}, reranked")
        text += f"\n![recall@1 against speed]({stem}.png)\n"
        (out / f"{stem}.json").write_text(json.dumps(rows, indent=1), encoding="utf-8")
    else:
        text = cache_study(repository, model, questions, connections, speed_questions, teacher_documents)
        name = f"rerank-{model}{'-teacher-documents' * teacher_documents}.md"
    out.mkdir(parents=True, exist_ok=True)
    (out / name).write_text(text, encoding="utf-8")
    print(text)


if __name__ == "__main__":
    app()
