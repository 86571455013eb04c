"""The two runs, for any task module: train (or fine-tune) a teacher, and distil a student from it.

Each run reads its data, builds models and loaders through the task module, calls the one training loop,
then writes an HF model directory (model + fast tokenizer, so tokenizer.json exists) and its report.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Protocol

from accelerate.utils import set_seed
from rich.console import Console
from torch.utils.data import DataLoader
from transformers import AutoTokenizer, PreTrainedModel, PreTrainedTokenizerBase, PreTrainedTokenizerFast

from training import classification
from training.models import (
    PRESETS,
    count_parameters,
    default_layer_map,
    load_teacher,
    load_trained,
    make_student,
)
from training.report import (
    DISTILL_REPORT,
    TRAIN_REPORT,
    git_revision,
    latency_ms,
    now,
    read_report,
    write_report,
)
from training.tokenizer import save_tokenizer, train_wordpiece
from training.trainer import EvalFn, History, StepFn, TrainConfig, train


class Task(Protocol):
    """What a task module offers (see training/classification.py); data objects are the task's own type."""

    TASK: str
    METRIC: str

    def load_data(self, path: str | Path) -> Any: ...
    def label_names(self, data: Any) -> list[str]: ...
    def texts(self, data: Any) -> list[str]: ...
    def sample_texts(self, data: Any, count: int, seed: int = 0) -> list[str]: ...
    def make_loader(
        self,
        data: Any,
        tokenizer: PreTrainedTokenizerBase,
        label2id: Any,
        *,
        batch_size: int,
        max_length: int,
        shuffle: bool,
        seed: int = 0,
    ) -> DataLoader: ...
    def teacher_step(self, model: Any, batch: Any, teacher: Any = None) -> Any: ...
    def distill_step(self, temperature: float, alpha_kd: float, alpha_hard: float) -> StepFn: ...
    def evaluate(
        self,
        model: Any,
        data: Any,
        tokenizer: PreTrainedTokenizerBase,
        *,
        max_length: int = 128,
        batch_size: int = 64,
    ) -> float: ...
    def agreement(
        self,
        student: Any,
        teacher: Any,
        data: Any,
        tokenizer: PreTrainedTokenizerBase,
        *,
        max_length: int = 128,
        batch_size: int = 64,
    ) -> float: ...


TASKS: dict[str, Task] = {classification.TASK: classification}


@dataclass(frozen=True)
class DistillConfig:
    """How the student is cut from the teacher and what it learns from: written into the report."""

    layers: int = 2
    # Teacher layers copied into the student; None: spread over the depth (models.default_layer_map).
    layer_map: tuple[int, ...] | None = None
    hidden_size: int | None = None  # narrower than the teacher: built from config, no weights copied
    temperature: float = 2.0
    alpha_kd: float = 0.5
    alpha_hard: float = 0.5


def get_task(name: str) -> Task:
    if name not in TASKS:
        raise ValueError(f"unknown task {name!r}; available: {', '.join(TASKS)}")
    return TASKS[name]


def _check_local(source: str | Path) -> None:
    """A path that is not a directory would otherwise surface as a puzzling hub-id error."""
    text = str(source)
    looks_local = text.startswith(("/", ".", "~")) or text.count("/") > 1 or Path(text).exists()
    if looks_local and not Path(text).expanduser().is_dir():
        raise ValueError(f"{text}: no such model directory (expected an HF model dir or a hub id)")


def _fast_tokenizer(source: str | Path) -> PreTrainedTokenizerFast:
    tokenizer = AutoTokenizer.from_pretrained(str(source))
    if not isinstance(tokenizer, PreTrainedTokenizerFast):
        raise ValueError(f"{source}: needs a fast tokenizer (tokenizer.json) so the service can load it")
    return tokenizer


def _split_record(data: Any, task: Task) -> dict[str, Any]:
    return {"source": str(data.source), "examples": len(task.texts(data))}


def _score(history: History, metric: str, evaluate: EvalFn, model: PreTrainedModel) -> float:
    """The last epoch's metric when the loop evaluated at the end of it, else a fresh evaluation."""
    last = history.epochs[-1] if history.epochs else {}
    return float(last[metric]) if metric in last else evaluate(model)[metric]


def _loader_and_evaluator(
    task: Task,
    train_data: Any,
    eval_data: Any,
    tokenizer: PreTrainedTokenizerFast,
    labelled_by: PreTrainedModel,
    cfg: TrainConfig,
    max_length: int,
) -> tuple[DataLoader, EvalFn]:
    """The shuffled train loader (labels mapped by `labelled_by`'s config) and the per-epoch evaluation."""
    loader = task.make_loader(
        train_data,
        tokenizer,
        labelled_by.config.label2id,
        batch_size=cfg.batch_size,
        max_length=max_length,
        shuffle=True,
        seed=cfg.seed,
    )

    def evaluate(m: Any) -> dict[str, float]:
        return {task.METRIC: task.evaluate(m, eval_data, tokenizer, max_length=max_length)}

    return loader, evaluate


def train_teacher(
    task_name: str,
    train_path: str | Path,
    eval_path: str | Path,
    out_dir: str | Path,
    *,
    source: str,
    cfg: TrainConfig,
    max_length: int = 128,
    vocab_size: int = 4000,
    console: Console | None = None,
) -> dict[str, Any]:
    """Train a preset from scratch (with a WordPiece vocabulary learnt on the train texts) or fine-tune
    a local/hub checkpoint; save it with its tokenizer and `train_report.json`. Returns the report."""
    console = console or Console()
    set_seed(cfg.seed)  # fresh weights (presets, new heads) depend on it, not only the training loop
    task = get_task(task_name)
    train_data, eval_data = task.load_data(train_path), task.load_data(eval_path)
    console.print(
        f"[bold]teacher[/] {source}: {len(task.texts(train_data))} train / {len(task.texts(eval_data))} eval"
    )

    from_scratch = source in PRESETS
    if from_scratch:
        tokenizer: PreTrainedTokenizerFast = train_wordpiece(task.texts(train_data), vocab_size=vocab_size)
        tokenizer.model_max_length = PRESETS[source]["max_position_embeddings"]
        console.print(f"trained a WordPiece vocabulary of {len(tokenizer)} tokens")
    else:
        _check_local(source)
        tokenizer = _fast_tokenizer(source)
    model = load_teacher(source, task.TASK, task.label_names(train_data), tokenizer_vocab_size=len(tokenizer))
    max_length = min(max_length, model.config.max_position_embeddings)

    loader, evaluate = _loader_and_evaluator(task, train_data, eval_data, tokenizer, model, cfg, max_length)

    history = train(model, loader, task.teacher_step, cfg, evaluate=evaluate, description="teacher")
    if not history.is_main_process:
        return {}
    score = _score(history, task.METRIC, evaluate, model)

    out = Path(out_dir)
    model.save_pretrained(out)
    save_tokenizer(tokenizer, out)
    report = {
        "task": task.TASK,
        "metric": task.METRIC,
        "teacher": {
            "source": source,
            "params": count_parameters(model),
            "score": score,
            "layers": int(model.config.num_hidden_layers),
            "hidden_size": int(model.config.hidden_size),
        },
        "labels": dict(model.config.id2label or {}),
        "eval": _split_record(eval_data, task),
        "train": _split_record(train_data, task),
        "recipe": {
            **cfg.to_dict(),
            "max_length": max_length,
            **({"vocab_size": vocab_size} if from_scratch else {}),
        },
        "history": history.epochs,
        "latency_ms": {
            "teacher": latency_ms(model, tokenizer, task.sample_texts(eval_data, 32), max_length=max_length)
        },
        "git_revision": git_revision(),
        "created_at": now(),
    }
    write_report(out, TRAIN_REPORT, report)
    console.print(f"[green]teacher[/] {task.METRIC} {score:.4f} -> {out}")
    return report


def distill(
    task_name: str,
    teacher_source: str | Path,
    train_path: str | Path,
    eval_path: str | Path,
    out_dir: str | Path,
    *,
    student: DistillConfig,
    cfg: TrainConfig,
    max_length: int = 128,
    console: Console | None = None,
) -> dict[str, Any]:
    """Distil a student from a trained teacher (local dir or hub id); both are scored on the same eval
    split. Saves the student with the teacher's tokenizer and `distill_report.json`. Returns the report."""
    console = console or Console()
    set_seed(cfg.seed)  # a narrower student starts from fresh weights
    task = get_task(task_name)
    train_data, eval_data = task.load_data(train_path), task.load_data(eval_path)
    _check_local(teacher_source)
    tokenizer = _fast_tokenizer(teacher_source)
    teacher = load_trained(str(teacher_source), task.TASK)
    max_length = min(max_length, teacher.config.max_position_embeddings)

    same_width = student.hidden_size in (None, teacher.config.hidden_size)
    layer_map = list(student.layer_map) if student.layer_map is not None else None
    if layer_map is None and same_width:
        layer_map = default_layer_map(int(teacher.config.num_hidden_layers), student.layers)
    model = make_student(teacher, student.layers, layer_map, student.hidden_size)
    origin = f"teacher layers {layer_map}" if same_width else f"config (hidden {student.hidden_size})"
    console.print(
        f"[bold]student[/] {student.layers} layers from {origin}: "
        f"{count_parameters(model):,} params (teacher {count_parameters(teacher):,})"
    )

    teacher_score = task.evaluate(teacher, eval_data, tokenizer, max_length=max_length)
    console.print(f"teacher {task.METRIC} on {eval_data.source}: {teacher_score:.4f}")
    loader, evaluate = _loader_and_evaluator(task, train_data, eval_data, tokenizer, teacher, cfg, max_length)

    step = task.distill_step(student.temperature, student.alpha_kd, student.alpha_hard)
    history = train(model, loader, step, cfg, teacher=teacher, evaluate=evaluate, description="student")
    if not history.is_main_process:
        return {}
    student_score = _score(history, task.METRIC, evaluate, model)
    agreement = task.agreement(model, teacher, eval_data, tokenizer, max_length=max_length)

    out = Path(out_dir)
    model.save_pretrained(out)
    save_tokenizer(tokenizer, out)
    teacher_report = read_report(teacher_source, TRAIN_REPORT) if Path(teacher_source).is_dir() else None
    texts = task.sample_texts(eval_data, 32)
    report = {
        "task": task.TASK,
        "metric": task.METRIC,
        "teacher": {
            "source": str(teacher_source),
            "trained_from": (teacher_report or {}).get("teacher", {}).get("source"),
            "params": count_parameters(teacher),
            "score": teacher_score,
            "layers": int(teacher.config.num_hidden_layers),
            "hidden_size": int(teacher.config.hidden_size),
        },
        "student": {
            "params": count_parameters(model),
            "score": student_score,
            "layers": int(model.config.num_hidden_layers),
            "hidden_size": int(model.config.hidden_size),
            "layer_map": layer_map,
        },
        "agreement": agreement,
        "labels": dict(model.config.id2label or {}),
        "eval": _split_record(eval_data, task),
        "train": _split_record(train_data, task),
        "recipe": {**asdict(student), **cfg.to_dict(), "max_length": max_length},
        "history": history.epochs,
        "latency_ms": {
            "teacher": latency_ms(teacher, tokenizer, texts, max_length=max_length),
            "student": latency_ms(model, tokenizer, texts, max_length=max_length),
        },
        "git_revision": git_revision(),
        "created_at": now(),
    }
    write_report(out, DISTILL_REPORT, report)
    console.print(
        f"[green]student[/] {task.METRIC} {student_score:.4f} (teacher {teacher_score:.4f}, "
        f"agreement {agreement:.4f}) -> {out}"
    )
    return report
