"""Offline engine speed: PyTorch eager vs each ONNX Runtime variant, one fresh process per engine.

    python -m benchmarks.engine_bench run --demo build/demo --out docs/bench/engines.md
    python -m benchmarks.engine_bench run --device cuda --out docs/bench/engines-gpu.md   # on a GPU host

For every demo teacher and student it exports all variants (through the parity gate) into `--exports`
(reused when already there, so a GPU host needs no exporter), then times a forward pass at batch 1 and 32,
sequence 128, one process per model and engine (ONNX Runtime's threads and torch's pool must never compete),
and writes a markdown table, the ratios and a PNG. On CUDA, torch runs fp32 and fp16 (`.half()`), ONNX
Runtime the fp32 and fp16 graphs with IO binding (inputs and outputs stay on the GPU) and, as the service
calls it today, fp16 with numpy in and out (`fp16-host`).
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any

import numpy as np
import typer
from rich.console import Console
from rich.progress import Progress

from benchmarks.plots import saved_figure
from common.cli import cli_app, print_warning
from common.logit_positions import LOGIT_POSITIONS, every_position
from common.progress import ProgressLog

console = Console(stderr=True)
BATCHES = (1, 32)
# Engines per device; an ONNX engine's name is the variant it runs (plus `-host`: numpy in and out).
ENGINES = {
    "cpu": ("torch", "fp32", "optimized", "int8"),
    "cuda": ("torch", "torch-fp16", "fp32", "fp16", "fp16-host"),
}
# (column label, slower engine, faster engine): each table cell is slower ÷ faster.
RATIOS = {
    "cpu": (
        ("torch ÷ ORT fp32", "torch", "fp32"),
        ("fp32 ÷ int8", "fp32", "int8"),
        ("fp32 ÷ opt", "fp32", "optimized"),
    ),
    "cuda": (
        ("torch ÷ ORT fp32", "torch", "fp32"),
        ("torch fp16 ÷ ORT fp16", "torch-fp16", "fp16"),
        ("fp32 ÷ fp16", "fp32", "fp16"),
        ("host ÷ IO binding", "fp16-host", "fp16"),
    ),
}
SIZES = {"cpu": ("fp32", "optimized", "int8"), "cuda": ("fp32", "fp16")}
DEMO_EVAL = {
    "text-classification": "classification/eval.jsonl",
    "question-answering": "qa/eval.json",
    "fill-mask": "text/eval.txt",
    "text-generation": "text/eval.txt",
}


# -- one measurement, in its own process -------------------------------------------------------------


def _inputs(vocab_size: int, batch: int, seq: int, names: list[str], layout: dict[str, int] | None) -> dict:
    rng = np.random.default_rng(0)
    feeds: dict[str, np.ndarray] = {
        "input_ids": rng.integers(5, vocab_size, size=(batch, seq), dtype=np.int64),
        "attention_mask": np.ones((batch, seq), dtype=np.int64),
        "token_type_ids": np.zeros((batch, seq), dtype=np.int64),
        "position_ids": np.tile(np.arange(seq, dtype=np.int64), (batch, 1)),
        LOGIT_POSITIONS: every_position(batch, seq),
    }
    if layout is not None:
        empty = np.zeros((batch, layout["num_heads"], 0, layout["head_dim"]), dtype=np.float32)
        for i in range(layout["num_layers"]):
            feeds[f"past_key_values.{i}.key"] = feeds[f"past_key_values.{i}.value"] = empty
    return {k: v for k, v in feeds.items() if k in names}


def _time(run: Any, budget_s: float = 2.0, max_runs: int = 50) -> float:
    """Median milliseconds of `run()` after warm-up."""
    for _ in range(3):
        run()
    samples: list[float] = []
    started = time.perf_counter()
    while len(samples) < max_runs and (len(samples) < 5 or time.perf_counter() - started < budget_s):
        t = time.perf_counter()
        run()
        samples.append((time.perf_counter() - t) * 1000)
    return statistics.median(samples)


def measure(
    engine: str, target: str, batches: tuple[int, ...], seq: int, threads: int, device: str
) -> list[float]:
    """Median ms per batch size; `target` is an HF dir for torch, a version dir for ONNX Runtime."""
    if engine.startswith("torch"):
        return _measure_torch(engine, target, batches, seq, threads, device)
    return _measure_ort(engine, target, batches, seq, threads, device)


def _measure_torch(
    engine: str, target: str, batches: tuple[int, ...], seq: int, threads: int, device: str
) -> list[float]:
    import torch
    from transformers import AutoConfig

    from export.tasks import SPECS, load_reference

    torch.set_num_threads(threads)
    task = _task_of_config(AutoConfig.from_pretrained(target))
    model, _ = load_reference(Path(target), SPECS[task])
    model = model.to(device)
    if engine == "torch-fp16":
        model = model.half()
    names = ["input_ids", "attention_mask"] + (["token_type_ids"] if task != "text-generation" else [])
    results = []
    for batch in batches:
        feeds = _inputs(model.config.vocab_size, batch, seq, names, None)
        tensors = {k: torch.from_numpy(v).to(device) for k, v in feeds.items()}

        def run_torch(tensors: dict[str, torch.Tensor] = tensors) -> None:
            with torch.no_grad():
                model(**tensors)
            if device == "cuda":
                torch.cuda.synchronize()

        results.append(_time(run_torch))
    return results


def _measure_ort(
    engine: str, target: str, batches: tuple[int, ...], seq: int, threads: int, device: str
) -> list[float]:
    import onnxruntime as ort

    variant, host = engine.removesuffix("-host"), engine.endswith("-host")
    manifest = json.loads((Path(target) / "manifest.json").read_text())
    options = ort.SessionOptions()
    options.intra_op_num_threads = threads
    options.inter_op_num_threads = 1
    path = Path(target) / manifest["variants"][variant]["file"]
    if device == "cuda":
        ort.preload_dlls()
        providers = ["CUDAExecutionProvider", "CPUExecutionProvider"]
    else:
        providers = ["CPUExecutionProvider"]
    session = ort.InferenceSession(str(path), options, providers=providers)
    if device == "cuda" and session.get_providers()[0] != "CUDAExecutionProvider":
        raise RuntimeError(f"CUDA asked for, ONNX Runtime runs on {session.get_providers()}")
    names = [i.name for i in session.get_inputs()]
    vocab = _vocab_size(Path(target) / "tokenizer.json")
    output = session.get_outputs()[0].name
    results = []
    for batch in batches:
        feeds = _inputs(vocab, batch, seq, names, manifest.get("generation"))
        if device == "cuda" and not host:
            binding = session.io_binding()
            for name, array in feeds.items():
                binding.bind_ortvalue_input(name, ort.OrtValue.ortvalue_from_numpy(array, "cuda", 0))
            binding.bind_output(output, "cuda")
            results.append(_time(lambda: session.run_with_iobinding(binding)))  # noqa: B023 (called at once)
        else:
            results.append(_time(lambda: session.run([output], feeds)))  # noqa: B023 (called at once)
    return results


def _vocab_size(tokenizer_json: Path) -> int:
    from tokenizers import Tokenizer

    return Tokenizer.from_file(str(tokenizer_json)).get_vocab_size()


def _task_of_config(config: Any) -> str:
    architecture = (config.architectures or [""])[0]
    for suffix, task in (
        ("ForSequenceClassification", "text-classification"),
        ("ForQuestionAnswering", "question-answering"),
        ("ForMaskedLM", "fill-mask"),
        ("LMHeadModel", "text-generation"),
        ("ForCausalLM", "text-generation"),
    ):
        if architecture.endswith(suffix):
            return task
    raise ValueError(f"cannot tell the task of {architecture!r}")


# -- the whole run -----------------------------------------------------------------------------------


@dataclass
class Row:
    task: str
    role: str
    params: int
    sizes_mb: dict[str, float]
    ms: dict[tuple[str, int], float]


def _spawn(engine: str, target: Path, seq: int, threads: int, device: str) -> list[float]:
    command = [sys.executable, "-m", "benchmarks.engine_bench", "measure", engine, str(target)]
    command += ["--batches", ",".join(map(str, BATCHES)), "--seq", str(seq), "--threads", str(threads)]
    command += ["--device", device]
    out = subprocess.run(command, capture_output=True, text=True, env={**os.environ})
    if out.returncode != 0:
        raise RuntimeError(f"{engine} on {target} failed:\n{out.stderr[-2000:]}")
    return [float(x) for x in out.stdout.strip().splitlines()[-1].split(",")]


def _exported(model_dir: Path, task: str, repository: Path, eval_data: Path | None, device: str) -> Path:
    """The version directory under `repository`: exported once, with the variants the device runs."""
    existing = sorted(repository.glob("bench/*/manifest.json"))
    if existing:
        return existing[-1].parent
    from export.pipeline import export_model

    variants = SIZES[device]
    result = export_model(model_dir, task, "bench", repository, variants, eval_data=eval_data)  # type: ignore[arg-type]
    if result.version_dir is None:
        raise RuntimeError(f"{model_dir}: fp32 failed its parity gate")
    for r in result.variants:
        if not r.passed:
            print_warning(f"{task} {model_dir.name}: {r.variant} skipped ({'; '.join(r.problems)})")
    return result.version_dir


def _params(model_dir: Path) -> int:
    report = model_dir / "distill_report.json"
    if report.is_file():
        return int(json.loads(report.read_text())["student"]["params"])
    report = model_dir / "train_report.json"
    if report.is_file():
        return int(json.loads(report.read_text())["teacher"]["params"])
    return 0


def _ratio(slow: float | None, fast: float | None) -> str:
    return "-" if slow is None or fast is None else f"{slow / fast:.2f}x"


def render(rows: list[Row], seq: int, threads: int, device: str) -> str:
    engines, ratios, sized = ENGINES[device], RATIOS[device], SIZES[device]
    where = f"{threads} CPU threads" if device == "cpu" else "CUDA"
    lines = [
        f"Median ms per forward pass, sequence {seq}, {where}; each model and engine in a fresh process.",
        "",
        f"| task | model | params | size {' / '.join(sized)} (MB) | batch | "
        + " | ".join(engines)
        + " | "
        + " | ".join(label for label, _, _ in ratios)
        + " |",
        "|---|---|---|---|---|" + "---|" * (len(engines) + len(ratios)),
    ]
    for row in rows:
        sizes = " / ".join(f"{row.sizes_mb.get(v, float('nan')):.1f}" for v in sized)
        for b in BATCHES:
            cells = " | ".join("-" if (m := row.ms.get((e, b))) is None else f"{m:.2f}" for e in engines)
            ratio_cells = " | ".join(
                _ratio(row.ms.get((slow, b)), row.ms.get((fast, b))) for _, slow, fast in ratios
            )
            lines.append(
                f"| {row.task} | {row.role} | {row.params:,} | {sizes} | {b} | {cells} | {ratio_cells} |"
            )
    return "\n".join(lines) + "\n"


def plot(rows: list[Row], device: str, out: Path) -> None:
    engines = ENGINES[device]
    size = (7 * len(BATCHES), 0.45 * len(rows) * len(engines) + 2)
    with saved_figure(out, size, columns=len(BATCHES)) as axes:
        for ax, b in zip(axes, BATCHES, strict=True):
            labels = [f"{r.task}\n{r.role}" for r in rows]
            y = np.arange(len(rows))
            height = 0.8 / len(engines)
            for i, engine in enumerate(engines):
                values = [r.ms.get((engine, b), np.nan) for r in rows]
                ax.barh(y + i * height, values, height, label=engine)
            ax.set_yticks(y + 0.4 - height / 2, labels)
            ax.invert_yaxis()
            ax.set_xlabel("ms per forward pass (lower is better)")
            ax.set_title(f"batch {b}, {device}")
            ax.legend()


app = cli_app(help=__doc__)


@app.command("measure")
def measure_command(
    engine: str,
    target: Path,
    batches: str = "1,32",
    seq: int = 128,
    threads: int = 2,
    device: str = "cpu",
) -> None:
    """One engine on one model (used internally: each runs in a fresh process); prints ms per batch size."""
    sizes = tuple(int(b) for b in batches.split(","))
    print(",".join(f"{ms:.4f}" for ms in measure(engine, str(target), sizes, seq, threads, device)))


@app.command("run")
def run_command(
    demo: Annotated[Path, typer.Option(help="Output of `python -m training demo`.")] = Path("build/demo"),
    out: Annotated[
        Path, typer.Option(help="Markdown file to write the table into (and a PNG beside it).")
    ] = Path("docs/bench/engines.md"),
    exports: Annotated[
        Path, typer.Option(help="Exports of every demo model: reused when present, written when not.")
    ] = Path("build/bench-exports"),
    device: Annotated[str, typer.Option(help="cpu, or cuda (torch and ONNX Runtime on the GPU).")] = "cpu",
    seq: int = 128,
    threads: Annotated[int, typer.Option(help="CPU threads per engine (torch and ORT alike).")] = 2,
) -> None:
    """Export every demo teacher and student, then time torch vs every ORT variant at batch 1 and 32."""
    if device not in ENGINES:
        raise typer.BadParameter(f"must be one of {', '.join(ENGINES)}", param_hint="'--device'")
    pairs = [
        (d.name, role)
        for d in sorted(demo.iterdir())
        if (d / "student").is_dir()
        for role in ("teacher", "student")
    ]
    engines = ENGINES[device]
    rows: list[Row] = []
    total = len(pairs) * len(engines)
    with (
        Progress(console=console, disable=not console.is_terminal) as progress,
        ProgressLog.beside(console, "engine benchmark", total, unit="measurements") as progress_log,
    ):
        bar = progress.add_task("engine benchmark", total=total)
        for task, role in pairs:
            model_dir = demo / task / role
            eval_file = demo / "data" / DEMO_EVAL[task]
            progress.update(bar, description=f"{task} {role}: export")
            progress_log.update(status=f"{task} {role}: export")
            eval_data = eval_file if eval_file.is_file() else None
            version = _exported(model_dir, task, exports / task / role, eval_data, device)
            manifest = json.loads((version / "manifest.json").read_text())
            sizes = {v: spec["size_bytes"] / 1e6 for v, spec in manifest["variants"].items()}
            row = Row(task, role, _params(model_dir), sizes, {})
            for engine in engines:
                progress.update(bar, description=f"{task} {role} {engine}")
                progress_log.update(status=f"{task} {role} {engine}")
                if engine.startswith("torch") or engine.removesuffix("-host") in manifest["variants"]:
                    target = model_dir if engine.startswith("torch") else version
                    for b, ms in zip(BATCHES, _spawn(engine, target, seq, threads, device), strict=True):
                        row.ms[(engine, b)] = ms
                progress.advance(bar)
                progress_log.update(advance=1)
            rows.append(row)
    table = render(rows, seq, threads, device)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(table, encoding="utf-8")
    plot(rows, device, out.with_suffix(".png"))
    console.print(table, soft_wrap=True)  # markdown to copy: never wrapped
    console.print(f"wrote {out} and {out.with_suffix('.png')}")


if __name__ == "__main__":
    app()
