"""The two runs, for any task module: train (or fine-tune) a teacher, and distil a student from it.

Each run reads its data, builds models and loaders through the task module, calls the one training loop,
then writes an HF model directory (model + fast tokenizer, so tokenizer.json exists) and its report.
"""

from __future__ import annotations

from dataclasses import asdict, replace
from pathlib import Path
from typing import Any, Protocol

from accelerate.utils import set_seed
from rich.console import Console
from torch.utils.data import DataLoader
from transformers import (
    AutoTokenizer,
    PretrainedConfig,
    PreTrainedModel,
    PreTrainedTokenizerBase,
    PreTrainedTokenizerFast,
)

from common.cli import line_console
from common.provenance import git_revision
from training import classification, fill_mask, generation, qa
from training.models import (
    PRESETS,
    count_parameters,
    default_layer_map,
    load_teacher,
    load_trained,
    make_student,
    preset_family,
)
from training.recipes import DistillConfig, TrainConfig
from training.report import (
    DISTILL_REPORT,
    GENERAL_REPORT,
    TRAIN_REPORT,
    file_sha256,
    latency_ms,
    now,
    read_report,
    write_report,
)
from training.steps import HiddenAlignment, make_alignment, model_inputs, trains_with
from training.tokenizer import TRAINERS, save_tokenizer, special_token_ids
from training.trainer import Batch, EvalFn, History, StepFn, train

__all__ = ["TASKS", "DistillConfig", "Task", "distill", "get_task", "train_teacher"]


class Task(Protocol):
    """What a task module offers (training/classification.py, fill_mask.py, generation.py); data objects
    are the task's own type. Its models load with `models.TASK_MODEL_CLASSES[TASK]`."""

    TASK: str  # the HF pipeline name: text-classification, question-answering, fill-mask, text-generation
    METRIC: str  # the main metric, one of the keys evaluate() returns
    HIGHER_IS_BETTER: bool  # False for perplexity
    FAMILY: str  # "bert" or "gpt2": the presets (models.PRESETS) and tokenizer a from-scratch run uses

    def load_data(self, path: str | Path) -> Any: ...
    def label_names(self, data: Any) -> list[str]: ...  # a label head's classes; [] when there is none
    def texts(self, data: Any) -> list[str]: ...  # what a from-scratch vocabulary is learnt from
    def make_loader(
        self,
        data: Any,
        tokenizer: PreTrainedTokenizerBase,
        config: PretrainedConfig,
        *,
        batch_size: int,
        max_length: int,
        shuffle: bool,
        seed: int = 0,
    ) -> DataLoader: ...  # batches for the model `config` belongs to; evaluation (shuffle=False) is fixed
    def teacher_step(self, model: Any, batch: Any, teacher: Any = None) -> Any: ...
    def distill_step(self, config: DistillConfig, alignment: HiddenAlignment | None = None) -> StepFn: ...
    def evaluate(
        self,
        model: Any,
        data: Any,
        tokenizer: PreTrainedTokenizerBase,
        *,
        max_length: int = 128,
        batch_size: int = 64,
    ) -> dict[str, float]: ...
    def agreement(
        self,
        student: Any,
        teacher: Any,
        data: Any,
        tokenizer: PreTrainedTokenizerBase,
        *,
        max_length: int = 128,
        batch_size: int = 64,
    ) -> float: ...  # top-1 agreement on the task's logits (labels, masked tokens, next tokens, ...)


TASKS: dict[str, Task] = {
    classification.TASK: classification,
    fill_mask.TASK: fill_mask,
    generation.TASK: generation,
    qa.TASK: qa,
}


def get_task(name: str) -> Task:
    if name not in TASKS:
        raise ValueError(f"unknown task {name!r}; available: {', '.join(TASKS)}")
    return TASKS[name]


def check_local(source: str | Path) -> None:
    """A path that is not a directory would otherwise surface as a puzzling hub-id error."""
    text = str(source)
    looks_local = text.startswith(("/", ".", "~")) or text.count("/") > 1 or Path(text).exists()
    if looks_local and not Path(text).expanduser().is_dir():
        raise ValueError(f"{text}: no such model directory (expected an HF model dir or a hub id)")


def fast_tokenizer(source: str | Path) -> PreTrainedTokenizerFast:
    tokenizer = AutoTokenizer.from_pretrained(str(source))
    if not isinstance(tokenizer, PreTrainedTokenizerFast):
        raise ValueError(f"{source}: needs a fast tokenizer (tokenizer.json) so the service can load it")
    return tokenizer


def _new_tokenizer(task: Task, preset: str, texts: list[str], vocab_size: int) -> PreTrainedTokenizerFast:
    """The vocabulary a from-scratch preset learns from the training texts (WordPiece or byte-level BPE)."""
    family = preset_family(preset)
    if family != task.FAMILY:
        matching = [name for name in PRESETS if preset_family(name) == task.FAMILY]
        raise ValueError(f"{task.TASK} trains {task.FAMILY} models: use a preset among {matching}")
    return TRAINERS[family](texts, vocab_size)


def _watch_task_metric(cfg: TrainConfig, task: Task) -> TrainConfig:
    """Early stopping watches the task's main metric, in its direction, unless the caller chose one."""
    if cfg.metric_name is not None:
        return cfg
    return replace(cfg, metric_name=task.METRIC, metric_mode="max" if task.HIGHER_IS_BETTER else "min")


def _split_record(data: Any, task: Task) -> dict[str, Any]:
    return {"source": str(data.source), "examples": len(task.texts(data)), "sha256": file_sha256(data.source)}


def _model_record(model: PreTrainedModel, metrics: dict[str, float], task: Task) -> dict[str, Any]:
    return {
        "params": count_parameters(model),
        "score": metrics[task.METRIC],
        "metrics": metrics,
        "layers": int(model.config.num_hidden_layers),
        "hidden_size": int(model.config.hidden_size),
    }


def _evaluator(task: Task, data: Any, tokenizer: PreTrainedTokenizerBase, max_length: int) -> EvalFn:
    def evaluate(model: Any) -> dict[str, float]:
        return task.evaluate(model, data, tokenizer, max_length=max_length)

    return evaluate


def _final_metrics(
    history: History, cfg: TrainConfig, evaluate: EvalFn, model: PreTrainedModel
) -> dict[str, float]:
    """The trained weights' metrics: the loop scored them at their epoch's end, so only a mixed-precision
    run (scored under autocast there) is scored again, in full precision like the teacher it is set beside."""
    metrics = history.final_metrics()
    return metrics if metrics and cfg.mixed_precision == "no" else evaluate(model)


def _latency_inputs(
    task: Task, data: Any, tokenizer: PreTrainedTokenizerBase, config: PretrainedConfig, max_length: int
) -> Batch:
    """32 random eval examples as the model sees them (the same for teacher and student)."""
    loader = task.make_loader(data, tokenizer, config, batch_size=32, max_length=max_length, shuffle=True)
    return model_inputs(next(iter(loader)))


def _common_report(
    task: Task, train_data: Any, eval_data: Any, recipe: dict[str, Any], history: Any
) -> dict[str, Any]:
    return {
        "task": task.TASK,
        "metric": task.METRIC,
        "higher_is_better": task.HIGHER_IS_BETTER,
        "eval": _split_record(eval_data, task),
        "train": _split_record(train_data, task),
        "recipe": recipe,
        "history": history.epochs,
        "git_revision": git_revision(),
        "created_at": now(),
    }


def _training_data(task: Task, path: str | Path) -> Any:
    """The task's training data; a label head needs two classes at least to learn anything."""
    data = task.load_data(path)
    labels = task.label_names(data)
    if labels and len(labels) < 2:
        raise ValueError(
            f"{path}: every example is labelled {labels[0]!r}; a classifier needs two classes at least"
        )
    return data


def _labels(task: Task, data: Any, model: PreTrainedModel) -> dict[Any, str]:
    return dict(model.config.id2label or {}) if task.label_names(data) else {}


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
    """Train a preset from scratch (with a vocabulary learnt on the train texts) or fine-tune a local/hub
    checkpoint; save it with its tokenizer and `train_report.json`. Returns the report."""
    console = console or line_console()
    set_seed(cfg.seed)  # fresh weights (presets, new heads) depend on it, not only the training loop
    task = get_task(task_name)
    cfg = _watch_task_metric(cfg, task)
    train_data, eval_data = _training_data(task, train_path), task.load_data(eval_path)
    console.print(
        f"[bold]teacher[/] {source}: {len(task.texts(train_data))} train / {len(task.texts(eval_data))} eval"
    )

    from_scratch = source in PRESETS
    if from_scratch:
        tokenizer = _new_tokenizer(task, source, task.texts(train_data), vocab_size)
        console.print(f"trained a {type(tokenizer).__name__} vocabulary of {len(tokenizer)} tokens")
    else:
        check_local(source)
        tokenizer = fast_tokenizer(source)
    model = load_teacher(
        source,
        task.TASK,
        task.label_names(train_data),
        tokenizer_vocab_size=len(tokenizer),
        token_ids=special_token_ids(tokenizer),
    )
    if from_scratch:
        tokenizer.model_max_length = int(model.config.max_position_embeddings)
    max_length = min(max_length, int(model.config.max_position_embeddings))

    loader = task.make_loader(
        train_data, tokenizer, model.config, batch_size=cfg.batch_size, max_length=max_length, shuffle=True
    )
    evaluate = _evaluator(task, eval_data, tokenizer, max_length)
    history = train(model, loader, task.teacher_step, cfg, evaluate=evaluate, description="teacher")
    if not history.is_main_process:
        return {}
    metrics = _final_metrics(history, cfg, evaluate, model)

    out = Path(out_dir)
    model.save_pretrained(out)
    save_tokenizer(tokenizer, out)
    recipe = {
        **cfg.to_dict(),
        "max_length": max_length,
        **({"vocab_size": vocab_size} if from_scratch else {}),
    }
    report = {
        **_common_report(task, train_data, eval_data, recipe, history),
        "teacher": {"source": source, **_model_record(model, metrics, task)},
        "labels": _labels(task, train_data, model),
        "latency_ms": {
            "teacher": latency_ms(
                model, _latency_inputs(task, eval_data, tokenizer, model.config, max_length)
            )
        },
    }
    write_report(out, TRAIN_REPORT, report)
    console.print(f"[green]teacher[/] {task.METRIC} {metrics[task.METRIC]:.4f} -> {out}")
    return report


def cut_student(teacher: PreTrainedModel, student: DistillConfig) -> tuple[PreTrainedModel, list[int] | None]:
    """The student model and the teacher layers it was copied from (None when built from config)."""
    same_width = student.hidden_size in (None, teacher.config.hidden_size)
    layer_map = list(student.layer_map) if student.layer_map is not None else None
    if layer_map is None and same_width:
        layer_map = default_layer_map(int(teacher.config.num_hidden_layers), student.layers)
    return make_student(teacher, student.layers, layer_map, student.hidden_size), layer_map


def resume_student(source: str | Path, task: str) -> tuple[PreTrainedModel, list[int] | None]:
    """A student trained by an earlier stage (general distillation), and the teacher layers it stands for:
    as its general_report.json records them, else spread over the depth as a cut would have."""
    check_local(source)
    model = load_trained(str(source), task)
    report = read_report(source, GENERAL_REPORT) or {}
    return model, report.get("student", {}).get("layer_map")


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
    student_init: str | Path | None = None,
    console: Console | None = None,
) -> dict[str, Any]:
    """Distil a student from a trained teacher (local dir or hub id); both are scored on the same eval
    split. Saves the student with the teacher's tokenizer and `distill_report.json`. Returns the report.

    `student_init`: start from a student an earlier stage trained (`python -m training general-distill`)
    instead of cutting one from the teacher; its depth and layer map replace `student`'s."""
    console = console or line_console()
    set_seed(cfg.seed)  # a narrower student and a projection start from fresh weights
    task = get_task(task_name)
    cfg = _watch_task_metric(cfg, task)
    train_data, eval_data = _training_data(task, train_path), task.load_data(eval_path)
    check_local(teacher_source)
    tokenizer = fast_tokenizer(teacher_source)
    teacher = load_trained(str(teacher_source), task.TASK)
    max_length = min(max_length, int(teacher.config.max_position_embeddings))

    if student_init is None:
        model, layer_map = cut_student(teacher, student)
    else:
        model, layer_map = resume_student(student_init, task.TASK)
        student = replace(
            student,
            layers=int(model.config.num_hidden_layers),
            layer_map=None if layer_map is None else tuple(layer_map),
            hidden_size=int(model.config.hidden_size),
        )
    alignment = (
        make_alignment(model, teacher, layer_map, student.hidden_loss) if student.alpha_hidden > 0 else None
    )
    origin = (
        f"teacher layers {layer_map}" if layer_map is not None else f"config (hidden {student.hidden_size})"
    ) + ("" if student_init is None else f", trained further by {student_init}")
    console.print(
        f"[bold]student[/] {student.layers} layers from {origin}: "
        f"{count_parameters(model):,} params (teacher {count_parameters(teacher):,})"
    )

    evaluate = _evaluator(task, eval_data, tokenizer, max_length)
    teacher_metrics = evaluate(teacher)
    console.print(f"teacher {task.METRIC} on {eval_data.source}: {teacher_metrics[task.METRIC]:.4f}")
    loader = task.make_loader(
        train_data, tokenizer, teacher.config, batch_size=cfg.batch_size, max_length=max_length, shuffle=True
    )
    step = task.distill_step(student, alignment)
    with trains_with(model, alignment):
        history = train(model, loader, step, cfg, teacher=teacher, evaluate=evaluate, description="student")
    if not history.is_main_process:
        return {}
    metrics = _final_metrics(history, cfg, evaluate, model)
    agreement = task.agreement(model, teacher, eval_data, tokenizer, max_length=max_length)

    out = Path(out_dir)
    model.save_pretrained(out)
    save_tokenizer(tokenizer, out)
    teacher_report = read_report(teacher_source, TRAIN_REPORT) if Path(teacher_source).is_dir() else None
    inputs = _latency_inputs(task, eval_data, tokenizer, teacher.config, max_length)
    recipe = {**asdict(student), **cfg.to_dict(), "max_length": max_length}
    report = {
        **_common_report(task, train_data, eval_data, recipe, history),
        "teacher": {
            "source": str(teacher_source),
            "trained_from": (teacher_report or {}).get("teacher", {}).get("source"),
            **_model_record(teacher, teacher_metrics, task),
        },
        "student": {
            **_model_record(model, metrics, task),
            "layer_map": layer_map,
            "initialised_from": None if student_init is None else str(student_init),
            "aligned_teacher_layers": list(alignment.teacher_layers) if alignment is not None else None,
        },
        "agreement": agreement,
        "labels": _labels(task, train_data, model),
        "latency_ms": {"teacher": latency_ms(teacher, inputs), "student": latency_ms(model, inputs)},
    }
    write_report(out, DISTILL_REPORT, report)
    console.print(
        f"[green]student[/] {task.METRIC} {metrics[task.METRIC]:.4f} "
        f"(teacher {teacher_metrics[task.METRIC]:.4f}, agreement {agreement:.4f}) -> {out}"
    )
    return report
