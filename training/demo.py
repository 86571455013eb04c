"""The demo: seeded data -> WordPiece vocabulary -> from-scratch teacher -> distilled student, no hub needed.

`build_demo_pair` is the quick version other stages' tests reuse to get a real teacher/student pair of
HF directories in a few seconds.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace
from pathlib import Path

from rich.console import Console

from training.data.demo import write_demo_data
from training.runs import DistillConfig, distill, train_teacher
from training.trainer import TrainConfig


@dataclass(frozen=True)
class DemoRecipe:
    """Everything that differs between the full demo and the quick one."""

    preset: str
    examples: int  # classification examples, train + eval
    vocab_size: int
    max_length: int
    teacher: TrainConfig
    student: TrainConfig
    distill: DistillConfig


# Full: ~4M-parameter teacher, a 2-layer student; fits in about a minute on 2 CPU cores.
FULL = DemoRecipe(
    preset="bert-demo",
    examples=4000,
    vocab_size=2000,
    max_length=64,
    teacher=TrainConfig(epochs=2, lr=5e-4, batch_size=32, warmup_ratio=0.1),
    student=TrainConfig(epochs=2, lr=5e-4, batch_size=32, warmup_ratio=0.1),
    distill=DistillConfig(layers=2, temperature=2.0, alpha_kd=0.5, alpha_hard=0.5),
)
# Quick: a tiny teacher and a 1-layer student, a few seconds in all (tests).
QUICK = DemoRecipe(
    preset="bert-tiny",
    examples=600,
    vocab_size=500,
    max_length=48,
    teacher=TrainConfig(epochs=2, lr=3e-3, batch_size=32, warmup_ratio=0.1),
    student=TrainConfig(epochs=1, lr=3e-3, batch_size=32, warmup_ratio=0.1),
    distill=DistillConfig(layers=1, temperature=2.0, alpha_kd=0.5, alpha_hard=0.5),
)

SUPPORTED_TASKS = ("text-classification",)


def run_demo(
    out_dir: str | Path,
    tasks: Sequence[str] = SUPPORTED_TASKS,
    *,
    seed: int = 0,
    quick: bool = False,
    console: Console | None = None,
) -> dict[str, tuple[Path, Path]]:
    """Write demo data under out_dir/data and a teacher/student pair per task under out_dir/<task>/.

    Returns {task: (teacher_dir, student_dir)}.
    """
    console = console or Console()
    unknown = [t for t in tasks if t not in SUPPORTED_TASKS]
    if unknown:
        raise ValueError(f"the demo has no {unknown} yet; available: {', '.join(SUPPORTED_TASKS)}")
    recipe = QUICK if quick else FULL
    root = Path(out_dir)
    console.rule(f"demo data (seed {seed})")
    files = write_demo_data(
        root / "data",
        seed=seed,
        n_classification=recipe.examples,
        n_qa=100 if quick else 1500,
        n_text_lines=100 if quick else 4000,
    )
    pairs: dict[str, tuple[Path, Path]] = {}
    for task in tasks:
        train, evals = files.classification_train, files.classification_eval
        teacher_dir, student_dir = root / task / "teacher", root / task / "student"
        console.rule(f"{task}: teacher ({recipe.preset}, from scratch)")
        train_teacher(
            task,
            train,
            evals,
            teacher_dir,
            source=recipe.preset,
            cfg=replace(recipe.teacher, seed=seed),
            max_length=recipe.max_length,
            vocab_size=recipe.vocab_size,
            console=console,
        )
        console.rule(f"{task}: student ({recipe.distill.layers} layers)")
        distill(
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
    return pairs


def build_demo_pair(out_dir: str | Path, quick: bool = True, seed: int = 0) -> tuple[Path, Path]:
    """A trained text-classification (teacher_dir, student_dir) pair of HF dirs with reports, for tests."""
    return run_demo(out_dir, [SUPPORTED_TASKS[0]], seed=seed, quick=quick, console=Console(quiet=True))[
        SUPPORTED_TASKS[0]
    ]
