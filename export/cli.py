"""`python -m export HF_MODEL_DIR --task TASK --name NAME --repository models/`."""

from __future__ import annotations

import logging
import sys
from pathlib import Path
from typing import Annotated, cast

import typer
from rich.console import Console
from rich.table import Table

from common.cli import one_command_app, print_error, print_warning
from common.progress import ProgressLog
from export.pipeline import ExportError, ExportResult, export_model, usage_problems
from export.variants import ALL_VARIANTS
from service.manifest import Task

console = Console(stderr=True)


def _summary(result: ExportResult) -> Table:
    table = Table(title="export summary")
    columns = ("variant", "size (MB)", "max |diff|", "top-1 agree", "greedy", "rows", "build (s)", "written")
    for column in columns:
        table.add_column(column)
    for r in result.variants:
        greedy = r.parity.greedy_match
        table.add_row(
            r.variant,
            f"{r.size_bytes / 1e6:.2f}",
            f"{r.parity.max_abs_diff:.2e}",
            f"{r.parity.top1_agreement:.4f}",
            "-" if greedy is None else f"{greedy:.3f}",
            str(r.parity.rows),
            f"{r.seconds:.1f}",
            "yes" if r.passed and result.version_dir else "no",
        )
    return table


def _explain_skipped(result: ExportResult) -> None:
    for r in result.variants:
        if not r.passed:
            print_warning(f"{r.variant} not written: {'; '.join(r.problems)}")


def _export(
    model_dir: Path,
    task: Task,
    name: str,
    repository: Path,
    variants: list[str],
    opset: int | None,
    seed: int,
    eval_data: Path | None,
) -> ExportResult:
    """The export, followable: a spinner naming its step on a terminal, else plain lines at an interval."""
    with (
        console.status("exporting") as status,
        ProgressLog.beside(console, "export") as progress_log,
    ):

        def progress(message: str) -> None:
            status.update(message)
            progress_log.update(status=message)

        return export_model(
            model_dir, task, name, repository, variants, opset, seed, eval_data, progress=progress
        )


def main(
    model_dir: Annotated[
        Path, typer.Argument(help="HF model directory (save_pretrained output, fast tokenizer).")
    ],
    task: Annotated[
        str, typer.Option(help="text-classification, question-answering, fill-mask or text-generation.")
    ],
    name: Annotated[str, typer.Option(help="Model name clients use, e.g. sentiment.")],
    repository: Annotated[Path, typer.Option(help="Model repository root.")] = Path("models"),
    variants: Annotated[
        str,
        typer.Option(help=f"Comma list of {', '.join(ALL_VARIANTS)}; each written only if it passes parity."),
    ] = ",".join(ALL_VARIANTS),
    eval_data: Annotated[
        Path | None,
        typer.Option(
            help="The task's eval file (JSONL/TSV, SQuAD JSON, text): top-1 agreement is measured on it."
        ),
    ] = None,
    opset: Annotated[int | None, typer.Option(help="ONNX opset; default: optimum's choice.")] = None,
    seed: Annotated[int, typer.Option(help="Seed of the generated parity inputs.")] = 0,
) -> None:
    """Export a model to ONNX, check every variant against PyTorch, write the next repository version."""
    logging.basicConfig(level=logging.WARNING)
    if not (model_dir / "config.json").is_file():
        print_error(f"{model_dir} is not an HF model directory (no config.json)")
        raise typer.Exit(2)
    wanted = [v.strip() for v in variants.split(",") if v.strip()]
    problems = usage_problems(task, name, repository, wanted, eval_data)
    for problem in problems:
        print_error(problem)
    if problems:
        raise typer.Exit(2)
    try:
        result = _export(model_dir, cast(Task, task), name, repository, wanted, opset, seed, eval_data)
    except (ExportError, ValueError, OSError) as e:  # the model or the data: the user's to fix
        print_error(f"export failed: {e}")
        raise typer.Exit(1) from e
    console.print(_summary(result))
    _explain_skipped(result)
    if result.version_dir is None:
        print_error("fp32 failed its parity gate: nothing written")
        raise typer.Exit(1)
    console.print(f"[green]wrote {result.version_dir}")
    print(result.version_dir, file=sys.stdout)


app = one_command_app(main)


def run() -> None:
    app()
