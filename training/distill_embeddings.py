"""Sentence-embedding distillation: a shallower student learns its teacher's sentence embeddings on
unlabelled sentences (sentence-transformers' recipe: MSE towards the teacher's embeddings).

Read top to bottom: the recipe, the student cut from the teacher, the teacher's embeddings computed once,
the loader, one training step, then the run that ties them together, scores both models (STS Spearman,
retrieval, speed: training/embedding_metrics.py) and writes the student as a sentence-transformers
directory with `distill_report.json`.

The loop is the one every task shares (training/trainer.py: progress, checkpoints, early stopping); the
student is cut the way every task cuts one (training/runs.py `cut_student`).
"""

from __future__ import annotations

import copy
import json
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any

import torch
import torch.nn as nn
from rich.console import Console
from torch.utils.data import DataLoader
from transformers import PreTrainedTokenizerFast

from common.cli import line_console
from common.progress import ProgressLog
from common.provenance import git_revision
from training.batches import make_dataloader, pad
from training.data.sentences import load_sentences, load_sts, squad_retrieval, sts_retrieval
from training.embedding_metrics import METRIC, StsEval, retrieval_scores, speed_report
from training.embeddings import Pooling, SentenceEncoder, describe, encode
from training.losses import LossTerms, embedding_loss
from training.models import count_parameters
from training.recipes import DistillConfig, HiddenLoss, TrainConfig
from training.report import DISTILL_REPORT, file_sha256, now, write_report
from training.runs import check_local, cut_student, fast_tokenizer
from training.steps import HiddenAlignment, make_alignment, trains_with
from training.tokenizer import save_tokenizer
from training.trainer import Batch, StepFn, train

TASK = "sentence-embeddings"  # not HF's "feature-extraction": that names token vectors, not pooled ones
TARGET = "teacher_embedding"  # the batch key of the cached teacher embeddings


@dataclass(frozen=True)
class EmbeddingDistillConfig:
    """How the student is cut and what it learns from; written into the report."""

    layers: int = 3
    layer_map: tuple[int, ...] | None = None  # None: spread over the depth (models.default_layer_map)
    hidden_size: int | None = None  # narrower: built from config, a learned projection to the teacher's width
    alpha_mse: float = 1.0
    alpha_cosine: float = 0.0
    alpha_hidden: float = 0.0  # hidden-state alignment (training/losses.py); runs the teacher every step
    hidden_loss: HiddenLoss = "mse"
    max_length: int | None = None  # truncation; None: the teacher's own (MiniLM: 256), never more


# --------------------------------------------------------------------------- student


def cut_encoder(
    teacher: SentenceEncoder, config: EmbeddingDistillConfig
) -> tuple[SentenceEncoder, list[int] | None]:
    """The student encoder and the teacher layers it was copied from (None when narrower, built from config).

    It pools as the teacher does; a student as wide as the teacher keeps the teacher's projection (if any),
    a narrower one gets a fresh projection to the teacher's embedding width.
    """
    cut = DistillConfig(layers=config.layers, layer_map=config.layer_map, hidden_size=config.hidden_size)
    backbone, layer_map = cut_student(teacher.backbone, cut)
    width = int(backbone.config.hidden_size)
    if width == teacher.width:
        projection = copy.deepcopy(teacher.projection)
    else:
        projection = nn.Linear(width, teacher.dim)
    return SentenceEncoder(backbone, teacher.pooling, projection, teacher.max_length), layer_map


# --------------------------------------------------------------------------- teacher embeddings, once


def teacher_embeddings(
    teacher: SentenceEncoder,
    tokenizer: PreTrainedTokenizerFast,
    sentences: list[str],
    *,
    max_length: int,
    key: dict[str, Any],
    cache: Path | None = None,
) -> torch.Tensor:
    """The frozen teacher's embedding of every training sentence, computed once (every epoch needs the
    same ones); with `cache`, kept in that file and read back when the teacher, data and length match."""
    if cache is not None and cache.is_file():
        saved = torch.load(cache, map_location="cpu", weights_only=True)
        if saved.get("key") == json.dumps(key, sort_keys=True):
            return saved["embeddings"]
    with ProgressLog("teacher embeddings", len(sentences), unit="sentences", active=True) as log:
        embeddings = encode(
            teacher,
            tokenizer,
            sentences,
            batch_size=64,
            max_length=max_length,
            progress=lambda done: log.update(completed=done),
        )
    if cache is not None:
        cache.parent.mkdir(parents=True, exist_ok=True)
        torch.save({"key": json.dumps(key, sort_keys=True), "embeddings": embeddings}, cache)
    return embeddings


# --------------------------------------------------------------------------- data


def sentence_loader(
    sentences: list[str],
    targets: torch.Tensor | None,
    tokenizer: PreTrainedTokenizerFast,
    *,
    batch_size: int,
    max_length: int,
    seed: int,
) -> DataLoader:
    """Shuffled batches of tokenised sentences, right-padded, with their teacher embeddings when cached."""
    ids = tokenizer(sentences, truncation=True, max_length=max_length)["input_ids"]
    pad_id = int(tokenizer.pad_token_id or 0)

    def collate(rows: list[int]) -> Batch:
        tokens = [ids[i] for i in rows]
        batch = {"input_ids": pad(tokens, pad_id), "attention_mask": pad([[1] * len(t) for t in tokens], 0)}
        if targets is not None:
            batch[TARGET] = targets[rows]
        return batch

    return make_dataloader(
        list(range(len(sentences))), collate, batch_size=batch_size, shuffle=True, seed=seed
    )


# --------------------------------------------------------------------------- one step


def embedding_step(config: EmbeddingDistillConfig, alignment: HiddenAlignment | None) -> StepFn:
    """Student embeddings against the teacher's (cached in the batch, or from the teacher's forward when
    the hidden states are aligned too). The trainer logs the embedding distance as `kd`."""
    align = alignment if config.alpha_hidden > 0 else None

    def step(student: nn.Module, batch: Batch, teacher: nn.Module | None) -> LossTerms:
        inputs = {"input_ids": batch["input_ids"], "attention_mask": batch["attention_mask"]}
        out = student(**inputs, output_hidden_states=align is not None)
        teacher_out = None
        if align is not None or TARGET not in batch:
            if teacher is None:
                raise ValueError("no cached teacher embeddings and no teacher to compute them")
            with torch.no_grad():
                teacher_out = teacher(**inputs, output_hidden_states=align is not None)
        target = batch[TARGET] if teacher_out is None else teacher_out.embedding
        terms = embedding_loss(
            out.embedding, target, alpha_mse=config.alpha_mse, alpha_cosine=config.alpha_cosine
        )
        zero = terms.total.new_zeros(())
        if align is None or teacher_out is None:
            return LossTerms(total=terms.total, kd=terms.total, hard=zero)
        hidden = align.loss(out.hidden_states, teacher_out.hidden_states, inputs["attention_mask"])
        return LossTerms(
            total=terms.total + config.alpha_hidden * hidden, kd=terms.total, hard=zero, hidden=hidden
        )

    return step


# --------------------------------------------------------------------------- the run


def _record(source: str | Path, examples: int) -> dict[str, Any]:
    return {"source": str(source), "examples": examples, "sha256": file_sha256(source)}


def _model_record(model: SentenceEncoder, metrics: dict[str, float]) -> dict[str, Any]:
    return {
        "params": count_parameters(model),
        "score": metrics[METRIC],
        "metrics": metrics,
        "layers": int(model.backbone.config.num_hidden_layers),
        "hidden_size": model.width,
        **describe(model),
    }


def distill_embeddings(
    teacher_source: str | Path,
    train_path: str | Path,
    sts_path: str | Path,
    out_dir: str | Path,
    *,
    config: EmbeddingDistillConfig,
    cfg: TrainConfig,
    retrieval_path: str | Path | None = None,
    pooling: Pooling | None = None,
    teacher_cache: Path | None = None,
    speed_sentences: int = 512,
    console: Console | None = None,
) -> dict[str, Any]:
    """Distil a sentence-embedding student from an encoder directory; both are scored on the same STS set
    (and retrieval sets). Saves the student with the teacher's tokenizer, its pooling rule and
    `distill_report.json`. Returns the report. `pooling` is for a teacher directory that names no rule."""
    console = console or line_console()
    torch.manual_seed(cfg.seed)  # a narrower student and its projection start from fresh weights
    check_local(teacher_source)
    tokenizer = fast_tokenizer(teacher_source)
    teacher = SentenceEncoder.load(teacher_source, pooling).eval()
    max_length = min(config.max_length or teacher.max_length, teacher.max_length)
    device = torch.device("cuda" if torch.cuda.is_available() and not cfg.cpu else "cpu")
    teacher.to(device)
    sentences = load_sentences(train_path).lines
    sts = load_sts(sts_path)

    student, layer_map = cut_encoder(teacher, config)
    student.max_length = max_length
    align = config.alpha_hidden > 0
    alignment = (
        make_alignment(student.backbone, teacher.backbone, layer_map, config.hidden_loss) if align else None
    )
    origin = f"config (hidden {config.hidden_size})" if layer_map is None else f"teacher layers {layer_map}"
    console.print(
        f"[bold]student[/] {config.layers} layers from {origin}: "
        f"{count_parameters(student):,} params (teacher {count_parameters(teacher):,}); pooling "
        f"{asdict(teacher.pooling)}, dim {teacher.dim}, max length {max_length}; "
        f"{len(sentences):,} train sentences, {len(sts.scores):,} STS pairs"
    )

    evaluate = StsEval(sts, teacher, tokenizer, max_length)
    teacher_metrics = evaluate(teacher)
    console.print(f"teacher {METRIC} on {sts.source}: {teacher_metrics[METRIC]:.4f}")
    key = {
        "teacher": str(Path(teacher_source).resolve()),
        "train_sha256": file_sha256(train_path),
        "sentences": len(sentences),
        "max_length": max_length,
        "pooling": asdict(teacher.pooling),
    }
    targets = None  # aligning hidden states runs the teacher every step: its embeddings come with them
    if not align:
        targets = teacher_embeddings(
            teacher, tokenizer, sentences, max_length=max_length, key=key, cache=teacher_cache
        )
    loader = sentence_loader(
        sentences, targets, tokenizer, batch_size=cfg.batch_size, max_length=max_length, seed=cfg.seed
    )
    cfg = replace(cfg, metric_name=cfg.metric_name or METRIC, metric_mode="max")
    with trains_with(student, alignment):
        history = train(
            student,
            loader,
            embedding_step(config, alignment),
            cfg,
            teacher=teacher if align else None,
            evaluate=evaluate,
            description="student",
        )
    if not history.is_main_process:
        return {}
    student.to(device).eval()
    metrics = history.final_metrics() if cfg.mixed_precision == "no" else {}
    metrics = metrics or evaluate(student)

    sets = {"sts": sts_retrieval(sts)}
    if retrieval_path is not None:
        sets["squad"] = squad_retrieval(retrieval_path)
    found = {
        name: retrieval_scores(student, teacher, data, tokenizer, max_length) for name, data in sets.items()
    }
    agreement = found["squad" if "squad" in found else "sts"]["top1_agreement"]
    speed, latency = speed_report(
        teacher, student, tokenizer, evaluate.sentences[:speed_sentences], max_length
    )
    speed["device"] = str(device)

    out = Path(out_dir)
    student.save(out)
    save_tokenizer(tokenizer, out)
    report = {
        "task": TASK,
        "metric": METRIC,
        "higher_is_better": True,
        "eval": _record(sts.source, len(sts.scores)),
        "train": _record(train_path, len(sentences)),
        "retrieval_eval": {name: _record(data.source, len(data.queries)) for name, data in sets.items()},
        "recipe": {
            **asdict(config),
            **cfg.to_dict(),
            "max_length": max_length,
            "teacher_cache": teacher_cache and str(teacher_cache),
        },
        "history": history.epochs,
        "git_revision": git_revision(),
        "created_at": now(),
        "teacher": {
            "source": str(teacher_source),
            "trained_from": None,
            **_model_record(teacher, teacher_metrics),
        },
        "student": {
            **_model_record(student, metrics),
            "layer_map": layer_map,
            "initialised_from": None,
            "aligned_teacher_layers": list(alignment.teacher_layers) if alignment is not None else None,
        },
        "agreement": agreement,
        "retrieval": found,
        "labels": {},
        "speed": speed,
        "latency_ms": latency,
    }
    write_report(out, DISTILL_REPORT, report)
    console.print(
        f"[green]student[/] {METRIC} {metrics[METRIC]:.4f} (teacher {teacher_metrics[METRIC]:.4f}), "
        f"retrieval top-1 agreement {agreement:.4f}, {speed['sentences_per_s']['student']:.0f} vs "
        f"{speed['sentences_per_s']['teacher']:.0f} sentences/s -> {out}"
    )
    return report
