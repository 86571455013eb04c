"""`python -m training import | lm-cache | lm-generate | lm-circuits | distil-lm`: a causal-LM teacher
brought in (a GGUF file or a local HF directory), and a student from a cache of its logits (`eval-lm`, which
scores the pair, is in cli_lm_eval.py).

The steps, each resumable by running it again with the same arguments: build the teacher's top-k cache
(training/lm_cache.py), optionally over more text the teacher writes itself (training/lm_generate.py), train
the student from it (training/distil_lm.py; `--layer-map circuits` cuts it through the layers that hold
the teacher's copying circuit, training/circuits.py), then score both models on the same eval blocks,
perplexity and speed side by side in one process.
"""

from __future__ import annotations

import time
from dataclasses import asdict
from pathlib import Path

import torch
import typer
from transformers import AutoModelForCausalLM, AutoTokenizer, PreTrainedModel

from common.cli import line_console
from common.progress import ProgressLog
from training import circuits, distil_lm, lm_cache, lm_generate
from training.cli_common import (
    StudentInitOpt,
    ThreadsOpt,
    app,
    check_out,
    parse_layer_map,
    setup_threads,
    user_errors,
)
from training.import_lm import DEFAULT_PROBE, import_causal_lm
from training.models import count_parameters

CpuOpt = typer.Option(False, "--cpu", help="Run on CPU even when a GPU is present.")
Bf16Opt = typer.Option(False, "--bf16", help="bfloat16 autocast (GPU).")
TeacherDirOpt = typer.Option(..., "--teacher", exists=True, file_okay=False, help="Teacher HF directory.")
TimeLimitOpt = typer.Option(
    None, "--time-limit", min=0.0, help="Stop (everything written, resumable) after this many minutes."
)
RawOpt = typer.Option(
    False,
    "--raw",
    help="The text exactly as written (line breaks, headings), as lm-evaluation-harness scores it; "
    "default: its prose lines, eos between them.",
)


def pick_device(cpu: bool) -> torch.device:
    return torch.device("cuda" if torch.cuda.is_available() and not cpu else "cpu")


def load_lm(path: str | Path, device: torch.device) -> PreTrainedModel:
    model: PreTrainedModel = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32)
    return model.to(device).eval()  # type: ignore[arg-type]


CIRCUITS = "circuits"


def _layer_map(value: str | None, teacher: PreTrainedModel, layers: int) -> list[int]:
    """`--layer-map`: teacher layers named, or `circuits` (chosen from the teacher's heads), or even."""
    if value == CIRCUITS:
        return circuits.circuit_layer_map(circuits.circuit_scores(teacher), layers)
    return list(parse_layer_map(value) or ())


@app.command(name="import")
def import_command(
    source: Path = typer.Argument(
        ..., exists=True, help="A .gguf file (byte-level BPE vocabulary) or a local HF causal LM directory."
    ),
    out: Path = typer.Option(..., "--out", file_okay=False, help="New HF model directory (a teacher)."),
    probe: str = typer.Option(
        DEFAULT_PROBE, "--probe", help="Prompt whose greedy continuation the import report records."
    ),
    threads: int | None = ThreadsOpt,
) -> None:
    """Import a causal LM as a float32 HF directory (safetensors, tokenizer, generation config, chat
    template, import_report.json) that `teacher`, `distill` and `python -m export` take as a teacher."""
    check_out(out, str(source), "source")
    setup_threads(threads)
    console = line_console(stderr=True)
    with (
        user_errors(),
        console.status("importing") as status,
        ProgressLog.beside(console, "import") as progress_log,
    ):

        def progress(message: str) -> None:
            status.update(message)
            progress_log.update(status=message)

        report = import_causal_lm(source, out, probe, progress=progress)
    check = report["check"]
    console.print(
        f"[green]wrote {out}[/]: {report['architecture']}, {report['params']:,} parameters, "
        f"{report['layers']} layers, {report['attention_heads']} heads / "
        f"{report['key_value_heads']} KV heads; "
        f"reloaded with max |logit diff| {check['max_abs_logit_diff_after_reload']:.1e}",
        soft_wrap=True,  # one line each in a log, whatever the console's width
    )
    console.print(f"probe: {check['probe']!r} -> {check['continuation']!r}", soft_wrap=True)


@app.command(name="lm-cache")
def lm_cache_command(
    teacher: Path = TeacherDirOpt,
    train: Path = typer.Option(
        ..., "--train", exists=True, dir_okay=False, help="Plain text, one paragraph a line."
    ),
    out: Path = typer.Option(..., "--out", file_okay=False, help="Cache directory (created, or continued)."),
    top_k: int = typer.Option(64, "--top-k", min=1, help="Teacher logits kept per position."),
    block_size: int = typer.Option(256, "--block-size", min=8, help="Tokens per block."),
    blocks: int | None = typer.Option(None, "--blocks", min=1, help="Cache this many blocks (default: all)."),
    batch_size: int = typer.Option(4, "--batch-size", min=1, help="Blocks per teacher forward pass."),
    seed: int = typer.Option(0, "--seed", help="Seed of the block order."),
    raw: bool = RawOpt,
    time_limit: float | None = TimeLimitOpt,
    cpu: bool = CpuOpt,
    threads: int | None = ThreadsOpt,
) -> None:
    """Run the teacher once over the text and keep its top-k logits (fp16) and ids (int32), memory-mapped."""
    check_out(out, str(teacher), "teacher")
    setup_threads(threads)
    console = line_console(stderr=True)
    with user_errors():
        model = load_lm(teacher, pick_device(cpu))
        tokenizer = AutoTokenizer.from_pretrained(teacher)
        started = time.monotonic()
        done_before = lm_cache.blocks_done(out) if (out / "meta.json").exists() else 0
        with ProgressLog("lm-cache", blocks, unit="blocks", completed=done_before, active=True) as log:
            done = lm_cache.build_cache(
                model,
                tokenizer,
                train,
                out,
                teacher_name=str(teacher),
                raw=raw,
                block_size=block_size,
                top_k=top_k,
                seed=seed,
                max_blocks=blocks,
                batch_size=batch_size,
                time_limit_s=None if time_limit is None else time_limit * 60,
                progress=lambda n, total: log.update(completed=n, status=f"of {total}"),
            )
    seconds = time.monotonic() - started
    meta = lm_cache.read_meta(out)
    new_tokens = (done - done_before) * block_size
    console.print(
        f"{out}: {done}/{meta.num_blocks} blocks of {block_size} tokens cached (top {top_k}); "
        f"this session {done - done_before} blocks in {seconds:.0f} s "
        f"({new_tokens / max(seconds, 1e-9):.0f} teacher tokens/s)",
        soft_wrap=True,
    )


@app.command(name="lm-generate")
def lm_generate_command(
    teacher: Path = TeacherDirOpt,
    train: Path = typer.Option(
        ..., "--train", exists=True, dir_okay=False, help="Plain text whose lines' openings are the prompts."
    ),
    out: Path = typer.Option(..., "--out", dir_okay=False, help="Text file written (or continued)."),
    prompts: int = typer.Option(..., "--prompts", min=1, help="Continuations to write in all."),
    prompt_tokens: int = typer.Option(32, "--prompt-tokens", min=1, help="Tokens of a real line per prompt."),
    new_tokens: int = typer.Option(224, "--new-tokens", min=1, help="Tokens the teacher adds per prompt."),
    temperature: float = typer.Option(1.0, "--temperature", min=0.01),
    top_p: float = typer.Option(0.95, "--top-p", min=0.01, max=1.0),
    batch_size: int = typer.Option(32, "--batch-size", min=1, help="Prompts per generate call."),
    seed: int = typer.Option(0, "--seed"),
    bf16: bool = Bf16Opt,
    time_limit: float | None = TimeLimitOpt,
    cpu: bool = CpuOpt,
    threads: int | None = ThreadsOpt,
) -> None:
    """Sample the teacher's continuations of the training text's lines into a text file: more text for
    `lm-cache` and `distil-lm` once the student has seen all of the real text (training/lm_generate.py)."""
    setup_threads(threads)
    console = line_console(stderr=True)
    settings = lm_generate.GenerateSettings(
        teacher=str(teacher.resolve()),
        source=str(train.resolve()),
        prompts=prompts,
        prompt_tokens=prompt_tokens,
        new_tokens=new_tokens,
        temperature=temperature,
        top_p=top_p,
        seed=seed,
    )
    with user_errors():
        model = load_lm(teacher, pick_device(cpu))
        tokenizer = AutoTokenizer.from_pretrained(teacher)
        started = time.monotonic()
        done_before = lm_generate.prompts_done(out) if out.exists() else 0
        with ProgressLog("lm-generate", prompts, unit="prompts", completed=done_before, active=True) as log:
            done = lm_generate.generate(
                model,
                tokenizer,
                out,
                settings,
                batch_size=batch_size,
                bf16=bf16,
                time_limit_s=None if time_limit is None else time_limit * 60,
                progress=lambda n, total: log.update(completed=n, status=f"of {total}"),
            )
    seconds = time.monotonic() - started
    new = (done - done_before) * new_tokens
    console.print(
        f"{out}: {done}/{prompts} continuations written; this session {done - done_before} "
        f"in {seconds:.0f} s (at most {new / max(seconds, 1e-9):.0f} generated tokens/s)",
        soft_wrap=True,
    )


@app.command(name="lm-circuits")
def lm_circuits_command(
    teacher: Path = TeacherDirOpt,
    layers: str = typer.Option("10,12", "--layers", help="Student depths to give a layer map for."),
    span: int = typer.Option(64, "--span", min=4, help="Random tokens, then the same again."),
    sequences: int = typer.Option(8, "--sequences", min=1),
    threads: int | None = ThreadsOpt,
) -> None:
    """Which of the teacher's layers hold its copying circuit (previous-token and induction heads), and the
    layer map `distil-lm --layer-map circuits` takes for each student depth."""
    setup_threads(threads)
    console = line_console()
    try:
        depths = [int(depth) for depth in layers.split(",")]
    except ValueError as err:
        raise typer.BadParameter(
            f"expected comma-separated depths, got {layers!r}", param_hint="--layers"
        ) from err
    with user_errors():
        model = load_lm(teacher, torch.device("cpu"))
        scores = circuits.circuit_scores(model, span=span, sequences=sequences)
        maps = {depth: circuits.circuit_layer_map(scores, depth) for depth in depths}
    console.print("layer  induction  previous-token  (best head's mean attention on the target)")
    for layer, (induction, previous) in enumerate(zip(scores.induction, scores.previous_token, strict=True)):
        marks = [
            name
            for name, score, floor in (
                ("induction head", induction, circuits.INDUCTION_MIN),
                ("previous-token head", previous, circuits.PREVIOUS_TOKEN_MIN),
            )
            if score >= floor
        ]
        console.print(f"{layer:5d}  {induction:9.2f}  {previous:14.2f}  {', '.join(marks)}")
    for depth, chosen in maps.items():
        console.print(f"{depth} layers: --layer-map {','.join(map(str, chosen))}")


@app.command(name="distil-lm")
def distil_lm_command(
    teacher: Path = TeacherDirOpt,
    cache: Path = typer.Option(..., "--cache", exists=True, file_okay=False, help="A cache from lm-cache."),
    out: Path = typer.Option(..., "--out", file_okay=False, help="Student HF directory and its checkpoint."),
    layers: int = typer.Option(10, "--layers", min=1, help="Student depth."),
    layer_map: str | None = typer.Option(
        None,
        "--layer-map",
        help="Teacher layers to copy, e.g. 0,3,6; 'circuits': the layers of its copying circuit "
        "(lm-circuits); default: spread evenly.",
    ),
    student_init: Path | None = StudentInitOpt,
    steps: int = typer.Option(1000, "--steps", min=1, help="Optimiser steps of the whole run."),
    batch_size: int = typer.Option(4, "--batch-size", min=1, help="Blocks per micro-batch."),
    grad_accum: int = typer.Option(1, "--grad-accum", min=1, help="Micro-batches per optimiser step."),
    lr: float = typer.Option(3e-4, "--lr", min=0.0, help="Peak learning rate (AdamW)."),
    warmup_steps: int = typer.Option(20, "--warmup-steps", min=0),
    temperature: float = typer.Option(1.0, "--temperature", min=0.01),
    alpha_kd: float = typer.Option(1.0, "--alpha-kd", min=0.0),
    alpha_hard: float = typer.Option(0.0, "--alpha-hard", min=0.0),
    top_k: int = typer.Option(0, "--top-k", min=0, help="Use the first k cached logits (0: all)."),
    kd_rest: bool = typer.Option(
        True,
        "--kd-rest/--no-kd-rest",
        help="Keep the teacher's probability outside its top k as one more class (needs a cache that records "
        "it, and temperature 1); off: the top k renormalised, as caches of format 1 train.",
    ),
    alpha_attention: float = typer.Option(
        0.0,
        "--alpha-attention",
        min=0.0,
        help="Weight of the student's attention matched to the teacher's in --attention-layers (the teacher "
        "then runs beside the student at every step).",
    ),
    attention_layers: str | None = typer.Option(
        None,
        "--attention-layers",
        help="Teacher layers whose attention the student matches, each one it kept, e.g. 17,18,20,23,24 "
        "(SmolLM2's induction layers).",
    ),
    attention_every: int = typer.Option(
        1,
        "--attention-every",
        min=1,
        help="Match attention on every n-th step only (the others run neither the teacher nor the eager "
        "attention kernel: cheaper steps).",
    ),
    seed: int = typer.Option(0, "--seed"),
    checkpoint_every: int = typer.Option(25, "--checkpoint-every", min=1),
    time_limit: float | None = TimeLimitOpt,
    bf16: bool = Bf16Opt,
    freeze_embeddings: bool = typer.Option(
        False, "--freeze-embeddings", help="Keep the teacher's token embeddings (and a head tied to them)."
    ),
    cpu: bool = CpuOpt,
    threads: int | None = ThreadsOpt,
) -> None:
    """Train a shallower student from the teacher's cached top-k logits; run again to resume (the
    checkpoint's settings win over the flags)."""
    check_out(out, str(teacher), "teacher")
    if student_init is not None and layer_map is not None:
        raise typer.BadParameter("a --student-init student keeps its own layers", param_hint="--layer-map")
    matched = list(parse_layer_map(attention_layers, "--attention-layers") or ())
    if alpha_attention > 0 and not matched:
        raise typer.BadParameter("name the teacher layers to match", param_hint="--attention-layers")
    setup_threads(threads)
    console = line_console(stderr=True)
    with user_errors():
        torch.manual_seed(seed)
        device = pick_device(cpu)
        teacher_model = load_lm(teacher, torch.device("cpu"))
        state = distil_lm.load_checkpoint(out)
        if state is not None:
            config = distil_lm.DistilLMConfig(**state["config"])  # type: ignore[arg-type]
            console.print(f"resuming {out} at step {state['step']}/{config.steps}", soft_wrap=True)
        else:
            config = distil_lm.DistilLMConfig(
                layers=layers,
                layer_map=_layer_map(layer_map, teacher_model, layers),
                steps=steps,
                batch_size=batch_size,
                grad_accum=grad_accum,
                lr=lr,
                warmup_steps=warmup_steps,
                temperature=temperature,
                alpha_kd=alpha_kd,
                alpha_hard=alpha_hard,
                top_k=top_k,
                kd_rest=kd_rest,
                seed=seed,
                bf16=bf16,
                freeze_embeddings=freeze_embeddings,
                student_init=str(student_init or ""),
                alpha_attention=alpha_attention,
                attention_layers=matched,
                attention_every=attention_every,
            )
        student = distil_lm.student_from_teacher(teacher_model, config)
        student.to(device)  # type: ignore[arg-type]
        beside = teacher_model.to(device) if config.alpha_attention > 0 else None  # type: ignore[arg-type]
        del teacher_model
        blocks = lm_cache.open_cache(cache, config.num_blocks or None)
        if config.kd_rest and (blocks.mass is None or config.temperature != 1):
            why = "the cache records no masses (format 1)" if blocks.mass is None else "temperature is not 1"
            console.print(f"the teacher's top k renormalised, its rest not a class: {why}", soft_wrap=True)
        started = time.monotonic()
        with ProgressLog(
            "distil-lm",
            config.steps,
            completed=int(state["step"]) if state else 0,  # type: ignore[call-overload]
            active=True,
        ) as log:

            def report(step: int, terms: dict[str, float]) -> None:
                log.update(completed=step, status=", ".join(f"{k} {v:.4g}" for k, v in terms.items()))

            step = distil_lm.train(
                student,
                blocks,
                config,
                out,
                checkpoint_every=checkpoint_every,
                time_limit_s=None if time_limit is None else time_limit * 60,
                log=report,
                teacher=beside,
            )
        student.save_pretrained(out)
        AutoTokenizer.from_pretrained(teacher).save_pretrained(out)
        distil_lm.write_json(
            out / "train_state.json",
            {
                "step": step,
                "config": asdict(config),
                "teacher": str(teacher),
                "cache": str(cache),
                "student_params": count_parameters(student),
                "session_seconds": round(time.monotonic() - started, 1),
            },
        )
    console.print(
        f"{out}: step {step}/{config.steps} ({'done' if step >= config.steps else 'run again to continue'}); "
        f"{config.layers} layers {config.layer_map}, {count_parameters(student):,} parameters",
        soft_wrap=True,
    )
