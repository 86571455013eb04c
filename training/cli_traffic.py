"""`python -m training traffic`: what a served pair's teacher answered (DISTILSERVE_CAPTURE_DIR) as the next
student's training file (training/traffic.py); then `distill --student-init <served student> --train OUT`."""

from __future__ import annotations

import json
from pathlib import Path
from typing import cast

import typer

from common.capture import SOURCES, Source
from common.cli import line_console
from training.cli_common import TaskOpt, app, user_errors
from training.data.loaders import load_classification, load_squad, load_text
from training.traffic import TASKS, traffic_dataset


def eval_texts(task: str, path: Path) -> list[str]:
    """The texts of a held-out file that no captured input may contain or lie inside: the task's format, or
    plain text (.txt), a text a line."""
    if path.suffix.lower() == ".txt":
        return load_text(path, skip_headings=False)
    if task == "text-classification":
        examples = load_classification(path).examples
        return [e.text for e in examples] + [e.pair for e in examples if e.pair is not None]
    if task == "question-answering":
        qa = load_squad(path)
        return [e.question for e in qa] + sorted({e.context for e in qa})
    return load_text(path)


def _sources(value: str) -> list[Source]:
    chosen = [s.strip() for s in value.split(",") if s.strip()]
    wrong = [s for s in chosen if s not in SOURCES]
    if wrong or not chosen:
        listed = ", ".join(SOURCES)
        raise typer.BadParameter(f"choose among {listed}, comma-separated", param_hint="--sources")
    return cast(list[Source], chosen)


@app.command(name="traffic")
def traffic_command(
    captures: list[Path] = typer.Argument(
        ...,
        exists=True,
        help="Captured traffic: DISTILSERVE_CAPTURE_DIR, a student's folder in it, or single .jsonl files.",
    ),
    out: Path = typer.Option(..., "--out", dir_okay=False, help="The training file to write."),
    task: str = TaskOpt,
    train: Path | None = typer.Option(
        None, "--train", exists=True, dir_okay=False, help="The original training data, kept first."
    ),
    eval: Path | None = typer.Option(
        None,
        "--eval",
        exists=True,
        dir_okay=False,
        help="Held-out data (the task's format, or .txt: a text a line): inputs containing one of its "
        "texts, or inside one, are left out, so that what a run scores stays unseen.",
    ),
    sources: str = typer.Option(
        "cascade,shadow,teacher",
        "--sources",
        help="Which captured inputs: cascade (the student was unsure), shadow (a sample of the rest), "
        "teacher (the teacher answered directly).",
    ),
    disagreed_only: bool = typer.Option(
        False, "--disagreed-only", help="Only inputs whose student answer was not the teacher's."
    ),
    original_rows: int | None = typer.Option(
        None,
        "--original-rows",
        min=0,
        help="Keep this many of --train's examples (drawn with --seed), a replay of the old data beside the "
        "traffic; default: all.",
    ),
    seed: int = typer.Option(0, "--seed", help="Seed of the --original-rows and --calibration draws."),
    calibration: Path | None = typer.Option(
        None,
        "--calibration",
        dir_okay=False,
        help="Write a share of the captured inputs here instead, alone: traffic the next student never "
        "trains on, for `export --eval-data` to gate and calibrate its cascade on the traffic it serves.",
    ),
    calibration_share: float = typer.Option(
        0.2, "--calibration-share", min=0.0, max=1.0, help="The share --calibration takes."
    ),
) -> None:
    """The inputs a served student's teacher answered, labelled by the teacher, as a training file (after the
    original training data): the next student learns the traffic it serves. Writes OUT and OUT.report.json
    (the counts)."""
    console = line_console()
    if task not in TASKS:
        raise typer.BadParameter(f"choose one of {', '.join(TASKS)}", param_hint="--task")
    chosen = _sources(sources)
    with user_errors():
        held_out = eval_texts(task, eval) if eval is not None else []
        counts = traffic_dataset(
            task,
            captures,
            out,
            train=train,
            eval_texts=held_out,
            sources=chosen,
            disagreed_only=disagreed_only,
            original_rows=original_rows,
            seed=seed,
            calibration=calibration,
            calibration_share=calibration_share,
        )
    report = {
        "task": task,
        "captures": [str(p) for p in captures],
        "train": None if train is None else str(train),
        "eval": None if eval is None else str(eval),
        "sources": chosen,
        "disagreed_only": disagreed_only,
        "original_rows": original_rows,
        "seed": seed,
        "calibration_file": None if calibration is None else str(calibration),
        **counts.as_dict(),
    }
    Path(f"{out}.report.json").write_text(json.dumps(report, indent=2) + "\n", encoding="utf-8")
    by_source = ", ".join(f"{k} {v}" for k, v in counts.read.items())
    console.print(
        f"[bold]traffic[/] {sum(counts.read.values())} captured records of {task} ({by_source}; teachers "
        f"{', '.join(counts.teachers) or 'none'}): {counts.kept} inputs kept, {counts.disagreed} of them "
        f"answered otherwise by the student; left out {counts.repeated} repeats, {counts.inside_eval} "
        f"touching the eval data, {counts.unusable} without a usable answer"
    )
    if len(counts.teachers) > 1:
        console.print(f"[yellow]warning[/] the records come from {len(counts.teachers)} teacher versions")
    console.print(f"[green]traffic[/] {counts.original} original + {counts.kept} captured examples -> {out}")
    if calibration is not None:
        console.print(
            f"[green]traffic[/] {counts.calibration} captured examples to calibrate on -> {calibration}"
        )
