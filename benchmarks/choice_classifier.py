"""A chat model as a zero-shot classifier through /v1/chat/completions, its answer free or held to the labels
(vLLM's `guided_choice`): how often the answer is a label at all, and how often the right one.

    python -m benchmarks.choice_classifier --repository build/real/smollm2/models --model smollm2-teacher \\
        --data ../shared/data/sst2_test.tsv

`--data` is a TSV with a header, a `sentence` and a `label` column (0, 1, ...: an index into `--labels`), as
SST-2's test file. Each sentence is asked once each way, `--streams` clients at once, greedy: "Is the
sentiment of this review negative or positive? Answer with one word." The free answer counts as a label
when its first word is one (case and punctuation aside), and, read leniently, when exactly one label is among
its words. Writes OUT/choice-classifier-MODEL.{md,json}.
"""

from __future__ import annotations

import asyncio
import csv
import json
import re
from pathlib import Path
from typing import Annotated, Any

import httpx
import typer
from rich.console import Console

from benchmarks.servers import serve
from common.cli import one_command_app
from common.progress import ProgressLog

console = Console(stderr=True)
QUESTION = "Is the sentiment of this review {labels}? Answer with one word.\n\nReview: {sentence}"


def rows_of(path: Path, limit: int) -> list[tuple[str, int]]:
    with path.open(encoding="utf-8", newline="") as f:
        reader = csv.DictReader(f, delimiter="\t", quoting=csv.QUOTE_NONE)
        return [(r["sentence"], int(r["label"])) for r in reader][:limit]


def label_of(answer: str, labels: list[str]) -> str | None:
    """The label a free answer names: its first word, lower-cased, without punctuation (None: none)."""
    words = re.findall(r"[a-z]+", answer.lower())
    return words[0] if words and words[0] in labels else None


def label_in(answer: str, labels: list[str]) -> str | None:
    """Read leniently: the one label the answer's words hold anywhere (None: none, or several)."""
    found = set(re.findall(r"[a-z]+", answer.lower())) & set(labels)
    return found.pop() if len(found) == 1 else None


async def ask_all(
    base: str, model: str, rows: list[tuple[str, int]], labels: list[str], guided: bool, streams: int
) -> list[str]:
    """Every sentence's answer, `streams` at once."""
    queue = list(enumerate(rows))
    answers: dict[int, str] = {}
    question_labels = " or ".join(labels)

    async def worker(client: httpx.AsyncClient) -> None:
        while queue:
            i, (sentence, _) = queue.pop(0)
            body: dict[str, Any] = {
                "model": model,
                "messages": [
                    {"role": "user", "content": QUESTION.format(labels=question_labels, sentence=sentence)}
                ],
                "max_tokens": 8,
                "temperature": 0,
            }
            if guided:
                body["guided_choice"] = labels
            reply = await client.post("/v1/chat/completions", json=body)
            reply.raise_for_status()
            answers[i] = reply.json()["choices"][0]["message"]["content"]

    async with httpx.AsyncClient(base_url=base, timeout=600) as client:
        await asyncio.gather(*(worker(client) for _ in range(streams)))
    return [answers[i] for i in range(len(rows))]


def scored(answers: list[str], rows: list[tuple[str, int]], labels: list[str]) -> dict[str, Any]:
    named = [label_of(a, labels) for a in answers]
    anywhere = [label_in(a, labels) for a in answers]
    truth = [labels[label] for _, label in rows]
    return {
        "labels_given": sum(n is not None for n in named) / len(rows),
        "accuracy": sum(n == t for n, t in zip(named, truth, strict=True)) / len(rows),
        "predicted": {label: named.count(label) for label in labels},
        "labels_anywhere": sum(n is not None for n in anywhere) / len(rows),
        "accuracy_anywhere": sum(n == t for n, t in zip(anywhere, truth, strict=True)) / len(rows),
    }


def main(
    repository: Annotated[
        Path, typer.Option(help="Model repository holding --model (with a chat template).")
    ],
    model: Annotated[str, typer.Option(help="The chat model's name.")],
    data: Annotated[Path, typer.Option(help="TSV with a header: sentence, label (an index into --labels).")],
    labels: Annotated[
        str, typer.Option(help="Comma list of the labels, in index order.")
    ] = "negative,positive",
    limit: Annotated[int, typer.Option(min=1, help="Rows of --data asked.")] = 100_000,
    streams: Annotated[int, typer.Option(min=1, help="Clients at once.")] = 8,
    out: Annotated[Path, typer.Option(help="Directory of the report.")] = Path("docs/bench"),
) -> None:
    """Zero-shot classification by a chat model, free and held to the labels."""
    names = [x.strip().lower() for x in labels.split(",") if x.strip()]
    if len(names) < 2:
        raise typer.BadParameter("two labels at least", param_hint="--labels")
    rows = rows_of(data, limit)
    results: dict[str, Any] = {}
    with serve(repository, {}) as base, ProgressLog("choice classifier", 2, unit="ways", active=True) as bar:
        for way, guided in (("free", False), ("guided_choice", True)):
            bar.update(status=way)
            answers = asyncio.run(ask_all(base, model, rows, names, guided, streams))
            results[way] = scored(answers, rows, names) | {"answers": answers}
            bar.update(advance=1)
    command = (
        f"python -m benchmarks.choice_classifier --repository {repository} --model {model} --data {data} "
        f"--labels {labels} --limit {limit} --streams {streams}"
    )
    lines = [
        "# A chat model as a zero-shot classifier (python -m benchmarks.choice_classifier)",
        "",
        f"`{command}` ({len(rows)} rows)",
        "",
        "| answer | answers that are a label | accuracy | predicted, by label | read leniently: a label "
        "| accuracy |",
        "|---|---|---|---|---|---|",
        *(
            f"| {way} | {r['labels_given']:.1%} | {r['accuracy']:.4f} | "
            + ", ".join(f"{k} {v}" for k, v in r["predicted"].items())
            + f" | {r['labels_anywhere']:.1%} | {r['accuracy_anywhere']:.4f} |"
            for way, r in results.items()
        ),
        "",
        "The first rows' free answers: "
        + "; ".join(f"`{a.strip()[:40]}`" for a in results["free"]["answers"][:5]),
    ]
    out.mkdir(parents=True, exist_ok=True)
    report = "\n".join(lines) + "\n"
    (out / f"choice-classifier-{model}.md").write_text(report)
    (out / f"choice-classifier-{model}.json").write_text(
        json.dumps({"command": command, **results}, indent=2)
    )
    console.print(report)


app = one_command_app(main, help=__doc__)

if __name__ == "__main__":
    app()
