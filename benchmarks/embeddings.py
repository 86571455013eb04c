"""Sentence embeddings: the student's and the teacher's engine speed, and /v1/embeddings served at load
against the raw engine.

    python -m benchmarks.embeddings --repository build/real/embeddings/models --student embeddings \\
        --teacher embeddings-teacher --out docs/bench

1. ONNX Runtime alone (benchmarks.raw_engine, a fresh process each): sequences/s of each model at batch 32
   on every core, and as one single-threaded call per core (the service's CPU default); student ÷ teacher.
2. The service: wrk at `--connections` on /v1/embeddings, one review text a request, each model in turn;
   served ÷ the raw engine's best for that model. With `--squad FILE`: its questions retrieve their
   paragraphs from served vectors, the teacher's, the student's, and the student's questions against the
   teacher's paragraphs (the student serving queries for an index its teacher built).
3. With `--live STS_FILE` (the STS set the distillation report scored, e.g. STS-B train): live agreement.
   Its distinct sentences through /v1/embeddings, 32 a request, with DISTILSERVE_SHADOW_RATE=1: the
   teacher embeds each again and the live mean cosine of the two vectors is set beside the manifest's
   `teacher_cosine` (the report's mean over the same sentences, in PyTorch); then the load of 2 with
   shadows on.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import httpx
import typer

from benchmarks.live_agreement import replay_with_shadows
from benchmarks.raw_engine import raw_in_process
from benchmarks.servers import serve
from benchmarks.wrk_load import LoadResult, load
from common.cli import cli_app
from loadtests.texts import reviews
from service.engine import available_cores

if TYPE_CHECKING:
    import torch

app = cli_app(help=__doc__)
REQUEST_TEXTS = 32


def latest(repository: Path, name: str) -> Path:
    return max((p for p in (repository / name).iterdir() if p.name.isdigit()), key=lambda p: int(p.name))


@app.command()
def main(
    repository: Annotated[Path, typer.Option(help="Model repository with both embedding models.")],
    student: Annotated[str, typer.Option()] = "embeddings",
    teacher: Annotated[str, typer.Option()] = "embeddings-teacher",
    connections: Annotated[int, typer.Option(min=1)] = 64,
    seconds: Annotated[int, typer.Option(min=1)] = 15,
    out: Annotated[Path, typer.Option()] = Path("docs/bench"),
    live: Annotated[
        Path | None, typer.Option(help="An STS file (.tsv, .jsonl): replay its sentences with shadows on.")
    ] = None,
    squad: Annotated[
        Path | None, typer.Option(help="A SQuAD file: its questions retrieve their paragraphs, served.")
    ] = None,
) -> None:
    cores = available_cores()
    raw = {
        name: {
            "b32": raw_in_process(latest(repository, name), 32, "cpu"),
            f"b32 {cores}x1": raw_in_process(latest(repository, name), 32, "cpu", cores),
        }
        for name in (student, teacher)
    }
    bodies = [json.dumps({"model": "{model}", "input": text}) for text in reviews(2000, seed=5)]
    served = {}
    with serve(repository, {}) as base:
        for name in (student, teacher):
            mine = [b.replace('"{model}"', json.dumps(name)) for b in bodies]
            served[name] = load(name, base, "/v1/embeddings", mine, connections, seconds)
        found = None if squad is None else served_retrieval(base, student, teacher, squad)
    lines = [
        "# Sentence embeddings: engine and served speed",
        "",
        f"| model | raw b32 seq/s (1 call, {cores} threads) | raw b32 ({cores} x 1 thread) | served req/s "
        f"at {connections} connections | served ÷ best raw | p50 / p99 ms |",
        "|---|---|---|---|---|---|",
    ]
    for name in (student, teacher):
        best = max(raw[name].values())
        r = served[name]
        lines.append(
            f"| {name} | {raw[name]['b32']:,.0f} | {raw[name][f'b32 {cores}x1']:,.0f} | {r.rps:,.0f} | "
            f"{r.rps / best:.2f} | {r.p50_ms:.1f} / {r.p99_ms:.1f} |"
        )
    ratio = max(raw[student].values()) / max(raw[teacher].values())
    lines += ["", f"Student ÷ teacher, raw engine at batch 32 (best of both layouts): {ratio:.2f}x.", ""]
    if found is not None and squad is not None:
        lines += retrieval_lines(found, student, teacher, squad)
    if live is not None:
        lines += live_agreement(repository, student, live, bodies, served[student], connections, seconds)
    text = "\n".join(lines)
    out.mkdir(parents=True, exist_ok=True)
    (out / "embeddings.md").write_text(text, encoding="utf-8")
    print(text)


def embedded(base: str, model: str, texts: list[str]) -> torch.Tensor:
    """`texts` through /v1/embeddings, REQUEST_TEXTS a request."""
    import torch

    rows: list[list[float]] = []
    with httpx.Client(base_url=base, timeout=300) as client:
        for i in range(0, len(texts), REQUEST_TEXTS):
            r = client.post("/v1/embeddings", json={"model": model, "input": texts[i : i + REQUEST_TEXTS]})
            r.raise_for_status()
            rows += [item["embedding"] for item in r.json()["data"]]
    return torch.tensor(rows)


def served_retrieval(base: str, student: str, teacher: str, squad: Path) -> dict[str, float]:
    """Each SQuAD question against its article's paragraphs, every vector served: recall@1 of the teacher,
    of the student, and of the student's questions against the teacher's paragraphs (`mixed`: a student
    embedding queries for an index its teacher built), with each one's agreement with the teacher's best."""
    import torch

    from training.data.sentences import squad_retrieval
    from training.embedding_metrics import retrieval

    data = squad_retrieval(squad)
    vectors = {
        name: (embedded(base, name, data.queries), embedded(base, name, data.candidates))
        for name in (student, teacher)
    }
    allowed = torch.tensor(data.query_groups)[:, None] == torch.tensor(data.candidate_groups)[None, :]
    return retrieval(vectors[student], vectors[teacher], torch.tensor(data.gold), allowed)


def retrieval_lines(found: dict[str, float], student: str, teacher: str, squad: Path) -> list[str]:
    return [
        f"Retrieval, served: {found['queries']:,.0f} questions of {squad}, each against its article's "
        "paragraphs (every vector from /v1/embeddings).",
        "",
        "| questions by | paragraphs by | recall@1 | best = the teacher's |",
        "|---|---|---|---|",
        f"| {teacher} | {teacher} | {found['teacher_recall_at_1']:.4f} | 100 % |",
        f"| {student} | {student} | {found['student_recall_at_1']:.4f} | {found['top1_agreement']:.2%} |",
        f"| {student} | {teacher} | {found['mixed_recall_at_1']:.4f} | {found['mixed_top1_agreement']:.2%} |",
        "",
    ]


def live_agreement(
    repository: Path,
    student: str,
    sts: Path,
    bodies: list[str],
    alone: LoadResult,
    connections: int,
    seconds: int,
) -> list[str]:
    """The report's lines on live agreement: the STS file's sentences replayed at shadow rate 1."""
    from training.data.sentences import load_sts

    data = load_sts(sts)
    sentences = list(dict.fromkeys(data.first + data.second))
    manifest = json.loads((latest(repository, student) / "manifest.json").read_text(encoding="utf-8"))
    offline = (manifest.get("distillation") or {}).get("teacher_cosine")
    chunks = [sentences[i : i + REQUEST_TEXTS] for i in range(0, len(sentences), REQUEST_TEXTS)]
    requests = [({"input": chunk, "model": student}, len(chunk)) for chunk in chunks]
    mine = [b.replace('"{model}"', json.dumps(student)) for b in bodies]
    found = replay_with_shadows(repository, "/v1/embeddings", requests, mine, offline, connections, seconds)
    recorded = "not recorded" if offline is None else f"{offline:.4f}"
    lines = [
        f"Live agreement: the {len(sentences):,} distinct sentences of {sts} through /v1/embeddings, "
        f"{REQUEST_TEXTS} a request, DISTILSERVE_SHADOW_RATE=1: {found.compared:.0f} checked by the teacher, "
        f"{found.dropped:.0f} dropped; **live mean cosine {found.agreement:.4f}** against {recorded} in the "
        "manifest (the distillation report's, PyTorch, the same sentences).",
        "",
    ]
    if found.under_load is not None:
        r = found.under_load
        lines += [
            f"Under load ({r.connections} connections, /v1/embeddings) with shadow rate 1: {r.rps:,.0f} "
            f"requests/s, p50 {r.p50_ms:.1f} ms, p99 {r.p99_ms:.1f} ms, {r.errors} errors, "
            f"{found.checked_under_load:.0f} texts checked and {found.dropped_under_load:.0f} dropped; "
            f"without shadows: {alone.rps:,.0f} requests/s, p50 {alone.p50_ms:.1f}, "
            f"p99 {alone.p99_ms:.1f} ms.",
            "",
        ]
    return lines


if __name__ == "__main__":
    app()
