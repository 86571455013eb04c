"""`python -m training distill-embeddings`: a sentence-embedding student from an encoder teacher
(training/distill_embeddings.py), scored on an STS set against the teacher."""

from __future__ import annotations

from pathlib import Path
from typing import cast

import typer

from common.cli import line_console
from training.backbones import MINILM, resolve
from training.cli_common import (
    AccumOpt,
    BatchOpt,
    CpuOpt,
    DecayOpt,
    DropoutOpt,
    MaxStepsOpt,
    PrecisionOpt,
    SeedOpt,
    ThreadsOpt,
    WarmupOpt,
    app,
    check_hidden_loss,
    check_out,
    parse_layer_map,
    setup_threads,
    train_config,
    user_errors,
)
from training.distill_embeddings import EmbeddingDistillConfig, distill_embeddings
from training.embeddings import POOLING_MODES, Pooling, PoolingMode


def _pooling(mode: str | None, normalize: bool) -> Pooling | None:
    if mode is None:
        return None
    if mode not in POOLING_MODES:
        raise typer.BadParameter(f"choose one of {', '.join(POOLING_MODES)}", param_hint="--pooling")
    return Pooling(cast(PoolingMode, mode), normalize)


@app.command(name="distill-embeddings")
def distill_embeddings_command(
    teacher: str = typer.Option(
        ...,
        "--teacher",
        help=f"Encoder HF directory (a sentence-transformers one names its pooling), or {MINILM} "
        "(its installed package).",
    ),
    train_text: Path = typer.Option(
        ...,
        "--train-text",
        exists=True,
        dir_okay=False,
        help="Unlabelled sentences: plain text one a line, or .jsonl/.tsv/.csv with a text/sentence column.",
    ),
    eval_sts: Path = typer.Option(
        ...,
        "--eval-sts",
        exists=True,
        dir_okay=False,
        help="STS pairs: .tsv/.csv/.jsonl with sentence1, sentence2 and score (STS-B's train.tsv as it is).",
    ),
    out: Path = typer.Option(..., "--out", file_okay=False, help="Output directory for the student."),
    eval_retrieval: Path | None = typer.Option(
        None,
        "--eval-retrieval",
        exists=True,
        dir_okay=False,
        help="SQuAD v1.1 JSON: questions retrieve their article's paragraphs (agreement, recall@1).",
    ),
    layers: int = typer.Option(3, "--layers", min=1, help="Student depth."),
    layer_map: str | None = typer.Option(None, "--layer-map", help="Teacher layers to copy, e.g. 0,2,5."),
    hidden_size: int | None = typer.Option(
        None, "--hidden-size", min=8, help="Narrower student (from config) with a learned projection."
    ),
    alpha_mse: float = typer.Option(1.0, "--alpha-mse", min=0.0, help="Weight of the embedding MSE."),
    alpha_cosine: float = typer.Option(0.0, "--alpha-cosine", min=0.0, help="Weight of 1 - cosine."),
    alpha_hidden: float = typer.Option(
        0.0,
        "--alpha-hidden",
        min=0.0,
        help="Weight of the hidden-state alignment (runs the teacher each step).",
    ),
    hidden_loss: str = typer.Option("mse", "--hidden-loss", help="Hidden-state distance: cosine or mse."),
    pooling: str | None = typer.Option(
        None, "--pooling", help="mean, cls or max, for a teacher directory that names no rule (default mean)."
    ),
    normalize: bool = typer.Option(True, "--normalize/--no-normalize", help="L2-normalise (with --pooling)."),
    teacher_cache: Path | None = typer.Option(
        None, "--teacher-cache", dir_okay=False, help="Keep the teacher's train embeddings in this file."
    ),
    epochs: int = typer.Option(1, "--epochs", min=1, help="Passes over the sentences."),
    lr: float = typer.Option(1e-4, "--lr", min=0.0, help="Peak learning rate."),
    batch_size: int = BatchOpt,
    seed: int = SeedOpt,
    max_length: int | None = typer.Option(
        None, "--max-length", min=8, help="Truncate to this many tokens (default: the teacher's own)."
    ),
    grad_accum: int = AccumOpt,
    warmup_ratio: float = WarmupOpt,
    weight_decay: float = DecayOpt,
    max_steps: int | None = MaxStepsOpt,
    dropout: float | None = DropoutOpt,
    mixed_precision: str = PrecisionOpt,
    cpu: bool = CpuOpt,
    threads: int | None = ThreadsOpt,
) -> None:
    """Distil a sentence-embedding student (fewer layers, cut from the teacher's) by MSE towards the
    teacher's embeddings on unlabelled sentences; report both on STS (Spearman), retrieval and speed."""
    config = EmbeddingDistillConfig(
        layers=layers,
        layer_map=parse_layer_map(layer_map),
        hidden_size=hidden_size,
        alpha_mse=alpha_mse,
        alpha_cosine=alpha_cosine,
        alpha_hidden=alpha_hidden,
        hidden_loss=check_hidden_loss(hidden_loss) or "mse",
        max_length=max_length,
    )
    rule = _pooling(pooling, normalize)
    setup_threads(threads)
    with user_errors():
        source = resolve(teacher)
        check_out(out, source, "--teacher")
        cfg = train_config(
            epochs=epochs,
            lr=lr,
            batch_size=batch_size,
            seed=seed,
            grad_accum=grad_accum,
            warmup_ratio=warmup_ratio,
            weight_decay=weight_decay,
            max_steps=max_steps,
            dropout=dropout,
            mixed_precision=mixed_precision,
            cpu=cpu,
        )
        distill_embeddings(
            source,
            train_text,
            eval_sts,
            out,
            config=config,
            cfg=cfg,
            retrieval_path=eval_retrieval,
            pooling=rule,
            teacher_cache=teacher_cache,
            console=line_console(),
        )
