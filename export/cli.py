"""`python -m export HF_MODEL_DIR --task TASK --name NAME --repository models/`."""

from __future__ import annotations

import logging
import sys
from functools import partial
from pathlib import Path
from typing import Annotated, cast

import typer
from rich import box
from rich.console import Console
from rich.table import Table

from common.cli import line_console, one_command_app, print_error, print_warning
from common.progress import ProgressLog
from export.calibration import CASCADE_TASKS
from export.pipeline import ExportError, ExportResult, PairSpec, export_model, usage_problems
from export.repository import served_teacher
from export.variants import ALL_VARIANTS, DEFAULT_VARIANTS, DRAFT_HEAD_TOKENS, DRAFT_VARIANTS
from service.manifest import DistillationRecord, Manifest, Task, TeacherRef

console = line_console(stderr=True)


def _summary(result: ExportResult) -> Table:
    table = Table(title="export summary", box=box.SIMPLE_HEAD, show_edge=False, padding=(0, 1, 0, 0))
    columns = ("variant", "MB", "max |diff|", "top-1/cos", "on", "rows", "greedy", "build s", "written")
    for column in columns:  # each cell on one line: a log's 80 columns hold them all
        table.add_column(column, no_wrap=True)
    for r in result.variants:
        greedy = r.parity.greedy_match
        how = [
            x for x in (r.recipe, None if r.head_tokens is None else f"head {r.head_tokens} + context") if x
        ]
        table.add_row(
            r.variant if not how else f"{r.variant} ({', '.join(how)})",
            f"{(r.size_bytes + r.data_bytes) / 1e6:.2f}",
            f"{r.parity.max_abs_diff:.2e}",
            f"{r.parity.top1_agreement if r.parity.min_cosine is None else r.parity.min_cosine:.4f}",
            "eval" if r.parity.eval_rows else "random",
            str(r.parity.rows),
            "-" if greedy is None else f"{greedy:.3f}",
            f"{r.seconds:.1f}",
            "yes" if r.passed and result.version_dir else "no",
        )
    return table


def _explain_skipped(result: ExportResult, eval_data: Path | None) -> None:
    """Why a variant is missing, what the gate could not check, and a window wider than training's."""
    if eval_data is None:
        print_warning(
            "no --eval-data: the parity gate compared random tokens only: it checked the fp32 graphs' "
            "numbers but no variant's answers on real inputs, so fp16 and int8 (judged by answers alone) "
            "are not written"
        )
    for r in result.variants:
        if not r.passed:
            print_warning(f"{r.variant} not written: {'; '.join(r.problems)}")
        elif r.tried:
            print_warning(f"{r.variant} quantized {r.recipe}, the gate having refused {'; '.join(r.tried)}")
    trained, window = result.trained_length, result.max_length
    if trained is not None and window is not None and window > trained:
        print_warning(
            f"the model was trained on at most {trained} tokens but the service will accept {window}: "
            f"longer inputs reach positions its training never saw; --max-length {trained} makes them agree"
        )


def _export(
    model_dir: Path,
    task: Task,
    name: str,
    repository: Path,
    variants: list[str],
    opset: int | None,
    seed: int,
    eval_data: Path | None,
    max_length: int | None,
    pair: PairSpec | None = None,
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
            model_dir,
            task,
            name,
            repository,
            variants,
            opset,
            seed,
            eval_data,
            progress=progress,
            max_length=max_length,
            pair=pair,
        )


def _report(result: ExportResult, eval_data: Path | None) -> None:
    """The summary table and what was left out; exit 1 when nothing was written."""
    table = _summary(result)
    # A pipe gives 80 columns: a wide row (a 255 MB model, 1,773 rows) would lose cells to '…' there.
    natural = console.measure(table, options=console.options.update_width(10_000)).maximum
    Console(stderr=True, width=max(console.width, natural)).print(table)
    _explain_skipped(result, eval_data)
    if result.version_dir is None:
        print_error("fp32 failed its parity gate: nothing written")
        raise typer.Exit(1)


def _pair(
    teacher_dir: Path,
    teacher: str | None,
    teacher_name: str,
    export_teacher: partial[ExportResult],
    eval_data: Path | None,
) -> PairSpec:
    """The teacher the student pairs with: the repository's `teacher` (NAME[:VERSION]) as it is, else
    `teacher_dir` exported now as `teacher_name`."""
    if teacher is not None:
        name, _, version = teacher.partition(":")
        if version and not version.isdigit():
            raise ValueError(f"--teacher {teacher!r}: NAME or NAME:VERSION, the version a number")
        repository = export_teacher.keywords["repository"]
        return PairSpec(served_teacher(repository, name, int(version) if version else None), teacher_dir)
    console.print(f"exporting the teacher {teacher_dir} as {teacher_name}")
    result = export_teacher(teacher_dir, name=teacher_name)
    _report(result, eval_data)
    assert result.version_dir is not None  # _report exits otherwise
    console.print(f"[green]wrote {result.version_dir}")
    return PairSpec(TeacherRef(name=teacher_name, version=int(result.version_dir.name)), teacher_dir)


def _distillation(result: ExportResult) -> DistillationRecord | None:
    """The distillation record the written student's manifest carries."""
    if result.version_dir is None:
        return None
    return Manifest.model_validate_json((result.version_dir / "manifest.json").read_text()).distillation


def _say_pair(result: ExportResult, pair: PairSpec, task: str) -> None:
    teacher = f"{pair.teacher.name} version {pair.teacher.version}"
    if task == "text-generation":
        console.print(f"paired with {teacher}: served together, the student drafts for it (speculative)")
        return
    if task not in CASCADE_TASKS:
        console.print(f"paired with {teacher} (no cascade for {task})")
        return
    if result.cascade is None:
        print_warning(f"paired with {teacher}; without --eval-data no cascade threshold was calibrated")
        return
    c = result.cascade
    if c.confidence == "score-margin":
        console.print(
            f"paired with {teacher}: a ranking cascade; the teacher reads again the documents within "
            f"{c.threshold:.4f} of the student's best logit ({c.fallback_rate:.1%} of the documents of "
            f"{c.eval_examples} eval queries), and the best document is the teacher's for {c.agreement:.2%} "
            f"of queries (target {c.target_agreement:.2%}; the student alone {c.student_agreement:.2%})"
        )
    else:
        console.print(
            f"paired with {teacher}: cascade threshold {c.threshold:.4f} sends {c.fallback_rate:.1%} of "
            f"{c.eval_examples} eval inputs to the teacher and agrees with it on {c.agreement:.2%} "
            f"(target {c.target_agreement:.2%}; the student alone {c.student_agreement:.2%})"
        )
    if c.student_cost is not None:
        console.print(f"the student costs {c.student_cost:.2f} of the teacher's time (PyTorch, this machine)")
    if c.paying_limit is not None:
        p = c.paying_limit
        console.print(
            f"the cascade costs less than the teacher alone up to {p.agreement:.2%} agreement (threshold "
            f"{p.threshold:.4f}, {p.fallback_rate:.1%} sent)"
        )
    record = _distillation(result)
    if record is not None and record.student_ahead:
        print_warning(
            f"the student scored {record.student.score} ({record.metric}) on its distillation eval and the "
            f"teacher {record.teacher.score}: a cascade gives the teacher's answers, at a cost in quality "
            "(serve with DISTILSERVE_CASCADE=off to keep the student's, or distil from a better teacher)"
        )
    if c.costs_more_than_teacher:
        print_warning(
            "at this threshold the cascade costs more than the teacher alone: the service answers with the "
            "teacher directly (a lower --cascade-target, or a request's cascade_threshold, uses the student)"
        )


def main(
    model_dir: Annotated[
        Path, typer.Argument(help="HF model directory (save_pretrained output, fast tokenizer).")
    ],
    task: Annotated[
        str,
        typer.Option(
            help="text-classification, question-answering, fill-mask, text-generation or sentence-embeddings."
        ),
    ],
    name: Annotated[str, typer.Option(help="Model name clients use, e.g. sentiment.")],
    repository: Annotated[Path, typer.Option(help="Model repository root.")] = Path("models"),
    variants: Annotated[
        str,
        typer.Option(
            help=f"Comma list of {', '.join(ALL_VARIANTS)}; each written only if it passes parity. draft: "
            "a generation student's, exported with its teacher (--teacher-dir): every weight 8-bit, used "
            "only to draft for the teacher on a CPU. int4 (not among the defaults): a model that was 4-bit "
            "at its source (a GGUF import in Q4_1), its weights written back as the 4-bit blocks they were."
        ),
    ] = ",".join(DEFAULT_VARIANTS),
    eval_data: Annotated[
        Path | None,
        typer.Option(
            help="The task's eval file (JSONL/TSV, SQuAD JSON, text): top-1 agreement is measured on it. "
            "Without it fp16 and int8 cannot be checked and are not written."
        ),
    ] = None,
    max_length: Annotated[
        int | None,
        typer.Option(
            help="Longest input the service accepts, in tokens (it truncates or refuses longer ones); "
            "default: the model's limit. Give the length it was trained on to make them agree."
        ),
    ] = None,
    teacher_dir: Annotated[
        Path | None,
        typer.Option(
            help="The student's teacher (HF directory): exported first as --teacher-name, or paired as it is "
            "with --teacher; the student's manifest names it and, with --eval-data, carries the cascade's "
            "calibrated threshold."
        ),
    ] = None,
    teacher_name: Annotated[
        str | None, typer.Option(help="Name the teacher is exported under; default: NAME-teacher.")
    ] = None,
    teacher: Annotated[
        str | None,
        typer.Option(
            help="Pair with a teacher already in the repository, NAME or NAME:VERSION (default its highest "
            "version), instead of exporting --teacher-dir again."
        ),
    ] = None,
    cascade_target: Annotated[
        float,
        typer.Option(
            min=0.0,
            max=1.0,
            help="The share of eval inputs on which the cascade (student, unsure inputs to the teacher) must "
            "agree with the teacher alone; the lowest threshold that reaches it is written. A cross-encoder "
            "(one label; --eval-data a pair file): the share of its queries whose best document must be "
            "the teacher's, and the least margin that reaches it.",
        ),
    ] = 0.99,
    draft_from: Annotated[
        Path | None,
        typer.Option(
            help="Build the draft variant from this checkpoint (HF directory, the model's tokenizer) instead "
            "of the model's own: e.g. a copy of the student tuned on its teacher's greedy text, which drafts "
            "better, while the student answers with its own weights."
        ),
    ] = None,
    draft_head_tokens: Annotated[
        int,
        typer.Option(
            min=0,
            help="The draft variant's output head scores the vocabulary's first N ids (a byte-level BPE's "
            "most frequent) plus the tokens of the contexts it drafts for, not every token: a cheaper draft "
            "step (the teacher checks every token). 0: the whole vocabulary.",
        ),
    ] = DRAFT_HEAD_TOKENS,
    opset: Annotated[int | None, typer.Option(help="ONNX opset; default: optimum's choice.")] = None,
    seed: Annotated[int, typer.Option(help="Seed of the generated parity inputs.")] = 0,
) -> None:
    """Export a model to ONNX, check every variant against PyTorch, write the next repository version."""
    logging.basicConfig(level=logging.WARNING)
    if not (model_dir / "config.json").is_file():
        print_error(f"{model_dir} is not an HF model directory (no config.json)")
        raise typer.Exit(2)
    wanted = [v.strip() for v in variants.split(",") if v.strip()]
    problems = usage_problems(task, name, repository, wanted, eval_data, max_length)
    for problem in problems:
        print_error(problem)
    if problems:
        raise typer.Exit(2)
    if teacher is not None and teacher_dir is None:
        print_error("--teacher names an exported teacher: give its HF directory as --teacher-dir too")
        raise typer.Exit(2)
    drafts = DRAFT_VARIANTS & set(wanted)
    if draft_from is not None and not (drafts and teacher_dir is not None and task == "text-generation"):
        print_error("--draft-from builds the draft variant: a text-generation student's, with --teacher-dir")
        raise typer.Exit(2)
    if draft_from is not None and not (draft_from / "config.json").is_file():
        print_error(f"--draft-from {draft_from} is not an HF model directory (no config.json)")
        raise typer.Exit(2)
    if (
        drafts
        and variants != ",".join(DEFAULT_VARIANTS)
        and (task != "text-generation" or teacher_dir is None)
    ):
        print_warning(
            f"{', '.join(sorted(drafts))} not built: only a text-generation student exported with its "
            "teacher (--teacher-dir) drafts for it"
        )
    try:
        pair = None
        if teacher_dir is not None:
            export_teacher = partial(
                _export, task=cast(Task, task), repository=repository, variants=wanted, opset=opset,
                seed=seed, eval_data=eval_data, max_length=max_length,
            )  # fmt: skip
            found = _pair(teacher_dir, teacher, teacher_name or f"{name}-teacher", export_teacher, eval_data)
            pair = PairSpec(found.teacher, found.teacher_dir, cascade_target, draft_from, draft_head_tokens)
        result = _export(
            model_dir, cast(Task, task), name, repository, wanted, opset, seed, eval_data, max_length, pair
        )
    except (ExportError, ValueError, OSError) as e:  # the model or the data: the user's to fix
        print_error(f"export failed: {e}")
        raise typer.Exit(1) from e
    _report(result, eval_data)
    if pair is not None:
        _say_pair(result, pair, task)
    console.print(f"[green]wrote {result.version_dir}")
    print(result.version_dir, file=sys.stdout)


app = one_command_app(main)


def run() -> None:
    app()
