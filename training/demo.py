"""The demo: seeded data -> teacher -> distilled student, per task, no hub needed.

Teachers learn from scratch with a vocabulary trained on the demo text, except extractive QA, which fine-tunes
the offline MiniLM encoder (training.backbones).

`build_demo_pair` (classification) and `build_demo_pairs` (any tasks) are the quick versions other stages'
tests reuse to get real teacher/student pairs of HF directories in a few seconds each.
"""

from __future__ import annotations

import json
import time
from collections.abc import Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from rich.console import Console

from common.cli import line_console
from training.backbones import MINILM, resolve
from training.data.demo import DemoFiles, write_demo_data
from training.models import PRESETS
from training.recipes import DistillConfig, TrainConfig
from training.runs import distill, train_teacher
from training.showcase import showcase


@dataclass(frozen=True)
class DemoRecipe:
    """Everything that differs between tasks, and between the full demo and the quick one."""

    source: str  # a preset trained from scratch, or backbones.MINILM fine-tuned
    vocab_size: int  # of the vocabulary a from-scratch teacher learns
    max_length: int
    teacher: TrainConfig
    student: TrainConfig
    distill: DistillConfig


def _train(epochs: int, lr: float, batch_size: int = 32) -> TrainConfig:
    """No dropout: the demo makes one to five passes over its data on a CPU budget (see TrainConfig)."""
    return TrainConfig(epochs=epochs, lr=lr, batch_size=batch_size, warmup_ratio=0.1, dropout=0.0)


# Full: small teachers and 2-layer students; all tasks fit in a few minutes on 2 CPU cores. The language
# models learn in many small steps (batches of 16): on a CPU budget the number of updates is what limits
# them (measured: a masked LM after 800 steps of 16 is far ahead of one after 400 steps of 32).
FULL: dict[str, DemoRecipe] = {
    "text-classification": DemoRecipe(
        source="bert-demo",
        vocab_size=2000,
        max_length=64,  # one epoch each: both reach accuracy 1.0 on the eval split after the first
        teacher=_train(epochs=1, lr=5e-4),
        student=_train(epochs=1, lr=5e-4),
        distill=DistillConfig(layers=2, temperature=2.0),
    ),
    # Reading comprehension is not learnt from ~1,000 questions from scratch (measured: F1 0.06 after 4
    # epochs); the pretrained MiniLM encoder reaches F1 0.99 in one pass, and a 3-layer cut of it keeps most
    # of that.
    "question-answering": DemoRecipe(
        source=MINILM,
        vocab_size=0,  # unused: MiniLM brings its own WordPiece vocabulary
        max_length=128,
        teacher=_train(epochs=1, lr=2e-4, batch_size=8),
        student=_train(epochs=2, lr=3e-4, batch_size=8),
        distill=DistillConfig(layers=3, temperature=2.0),
    ),
    "fill-mask": DemoRecipe(
        source="bert-mlm",
        vocab_size=1000,
        max_length=64,
        teacher=_train(epochs=5, lr=1e-3, batch_size=16),
        student=_train(epochs=2, lr=5e-4, batch_size=16),
        distill=DistillConfig(layers=2, temperature=2.0),
    ),
    "text-generation": DemoRecipe(
        source="gpt2-demo",
        vocab_size=2000,
        max_length=64,
        teacher=_train(epochs=2, lr=1e-3, batch_size=16),
        student=_train(epochs=1, lr=5e-4, batch_size=16),
        distill=DistillConfig(layers=2, temperature=1.0),
    ),
}


def _quick(source: str, teacher_epochs: int, temperature: float) -> DemoRecipe:
    """Tiny teachers and 1-layer students, a few seconds per task (tests)."""
    return DemoRecipe(
        source=source,
        vocab_size=500,
        max_length=48,
        teacher=_train(epochs=teacher_epochs, lr=3e-3),
        student=_train(epochs=1, lr=3e-3),
        distill=DistillConfig(layers=1, temperature=temperature),
    )


QUICK: dict[str, DemoRecipe] = {
    "text-classification": _quick("bert-tiny", teacher_epochs=2, temperature=2.0),
    "question-answering": _quick("bert-tiny", teacher_epochs=1, temperature=2.0),
    "fill-mask": _quick("bert-tiny", teacher_epochs=1, temperature=2.0),
    "text-generation": _quick("gpt2-tiny", teacher_epochs=1, temperature=1.0),
}
SUPPORTED_TASKS = tuple(FULL)

# Examples per split family (train + eval): classification reviews, QA questions, text lines.
FULL_SIZES = {"n_classification": 4000, "n_qa": 1000, "n_text_lines": 4000}
# 200 classification eval rows: the int8 parity gate (>= 99 % top-1) then survives a borderline row or two
# of a quickly trained student, where one in 60 failed it now and then.
QUICK_SIZES = {"n_classification": 2000, "n_qa": 100, "n_text_lines": 100}


def _splits(files: DemoFiles, task: str) -> tuple[Path, Path]:
    """The (train, eval) files a task reads: reviews, SQuAD JSON, or plain text lines (MLM and LM)."""
    if task == "text-classification":
        return files.classification_train, files.classification_eval
    if task == "question-answering":
        return files.qa_train, files.qa_eval
    return files.text_train, files.text_eval


def run_demo(
    out_dir: str | Path,
    tasks: Sequence[str] = SUPPORTED_TASKS,
    *,
    seed: int = 0,
    quick: bool = False,
    console: Console | None = None,
) -> dict[str, tuple[Path, Path]]:
    """Write demo data under out_dir/data and a teacher/student pair per task under out_dir/<task>/, plus
    out_dir/demo_summary.json (wall time, scores and the students' answers to canonical inputs).

    Returns {task: (teacher_dir, student_dir)}.
    """
    console = console or line_console()
    unknown = [t for t in tasks if t not in SUPPORTED_TASKS]
    if unknown:
        raise ValueError(f"the demo has no {unknown} yet; available: {', '.join(SUPPORTED_TASKS)}")
    recipes = QUICK if quick else FULL
    sources = {task: resolve(recipes[task].source) for task in tasks}  # a missing backbone fails first
    root = Path(out_dir)
    console.rule(f"demo data (seed {seed})")
    files = write_demo_data(root / "data", seed=seed, **(QUICK_SIZES if quick else FULL_SIZES))
    pairs: dict[str, tuple[Path, Path]] = {}
    summary: dict[str, Any] = {}
    for task in tasks:
        started = time.perf_counter()
        recipe, (train, evals) = recipes[task], _splits(files, task)
        teacher_dir, student_dir = root / task / "teacher", root / task / "student"
        kind = "from scratch" if recipe.source in PRESETS else "fine-tuned"
        console.rule(f"{task}: teacher ({recipe.source}, {kind})")
        train_teacher(
            task,
            train,
            evals,
            teacher_dir,
            source=sources[task],
            cfg=replace(recipe.teacher, seed=seed),
            max_length=recipe.max_length,
            vocab_size=recipe.vocab_size,
            console=console,
        )
        console.rule(f"{task}: student ({recipe.distill.layers} layers)")
        report = distill(
            task,
            teacher_dir,
            train,
            evals,
            student_dir,
            student=recipe.distill,
            cfg=replace(recipe.student, seed=seed),
            max_length=recipe.max_length,
            console=console,
        )
        pairs[task] = (teacher_dir, student_dir)
        summary[task] = _summary(report, teacher_dir, student_dir, time.perf_counter() - started)
        for role in ("teacher", "student"):
            console.print(f"{role}: {summary[task]['showcase'][role]}")
    (root / "demo_summary.json").write_text(json.dumps(summary, indent=2) + "\n", encoding="utf-8")
    return pairs


def _summary(report: dict[str, Any], teacher_dir: Path, student_dir: Path, seconds: float) -> dict[str, Any]:
    """What a person checks first: how long it took, both scores, and what the models answer."""
    task = report["task"]
    return {
        "seconds": round(seconds, 1),
        "metric": report["metric"],
        "teacher": report["teacher"]["score"],
        "student": report["student"]["score"],
        "agreement": report["agreement"],
        "params": {"teacher": report["teacher"]["params"], "student": report["student"]["params"]},
        "showcase": {"teacher": showcase(task, teacher_dir), "student": showcase(task, student_dir)},
    }


def build_demo_pairs(
    out_dir: str | Path, tasks: Sequence[str], quick: bool = True, seed: int = 0
) -> dict[str, tuple[Path, Path]]:
    """Trained (teacher_dir, student_dir) pairs of HF dirs with reports, per task, for tests."""
    return run_demo(out_dir, tasks, seed=seed, quick=quick, console=Console(quiet=True))


def build_demo_pair(out_dir: str | Path, quick: bool = True, seed: int = 0) -> tuple[Path, Path]:
    """A trained text-classification (teacher_dir, student_dir) pair of HF dirs with reports, for tests."""
    return build_demo_pairs(out_dir, ["text-classification"], quick=quick, seed=seed)["text-classification"]
