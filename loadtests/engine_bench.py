"""Offline engine speed: PyTorch eager vs each ONNX Runtime variant, one fresh process per measurement.

    python -m loadtests.engine_bench --demo build/demo --out docs/benchmarks.md

For every demo teacher and student it exports all variants (through the parity gate) into a scratch
repository, then times a forward pass at batch 1 and 32, sequence 128, in separate processes (ONNX Runtime's
spinning threads and torch's pool must never compete), and writes a markdown table, the ratios and a PNG.
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any

import numpy as np
import typer
from rich.console import Console
from rich.progress import Progress

console = Console(stderr=True)
ENGINES = ("torch", "fp32", "optimized", "int8")  # fp16 pays off only on a GPU
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


def measure(engine: str, target: str, batch: int, seq: int, threads: int) -> float:
    """`target`: an HF dir for torch, a version dir (manifest + variants) for ONNX Runtime."""
    if engine == "torch":
        import torch
        from transformers import AutoConfig

        from export.tasks import SPECS, load_reference

        torch.set_num_threads(threads)
        task = _task_of_config(AutoConfig.from_pretrained(target))
        model, _ = load_reference(Path(target), SPECS[task])
        names = ["input_ids", "attention_mask"] + (["token_type_ids"] if task != "text-generation" else [])
        tensors = {
            k: torch.from_numpy(v)
            for k, v in _inputs(model.config.vocab_size, batch, seq, names, None).items()
        }

        def run_torch() -> None:
            with torch.no_grad():
                model(**tensors)

        return _time(run_torch)

    import onnxruntime as ort

    manifest = json.loads((Path(target) / "manifest.json").read_text())
    options = ort.SessionOptions()
    options.intra_op_num_threads = threads
    options.inter_op_num_threads = 1
    path = Path(target) / manifest["variants"][engine]["file"]
    session = ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])
    names = [i.name for i in session.get_inputs()]
    vocab = _vocab_size(Path(target) / "tokenizer.json")
    feeds = _inputs(vocab, batch, seq, names, manifest.get("generation"))
    outputs = [o.name for o in session.get_outputs()][:1]
    return _time(lambda: session.run(outputs, feeds))


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


def _spawn(engine: str, target: Path, batch: int, seq: int, threads: int) -> float:
    command = [sys.executable, "-m", "loadtests.engine_bench", "measure", engine, str(target)]
    command += ["--batch", str(batch), "--seq", str(seq), "--threads", str(threads)]
    out = subprocess.run(command, capture_output=True, text=True, check=True, env={**os.environ})
    return float(out.stdout.strip().splitlines()[-1])


def _export_all(model_dir: Path, task: str, repository: Path, eval_data: Path | None) -> Path:
    from export.pipeline import export_model
    from export.variants import ALL_VARIANTS

    result = export_model(model_dir, task, "bench", repository, ALL_VARIANTS, eval_data=eval_data)  # type: ignore[arg-type]
    if result.version_dir is None:
        raise RuntimeError(f"{model_dir}: fp32 failed its parity gate")
    for r in result.variants:
        if not r.passed:
            console.print(f"[yellow]{task} {model_dir.name}: {r.variant} skipped ({'; '.join(r.problems)})")
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


def render(rows: list[Row], batches: tuple[int, ...], seq: int, threads: int) -> str:
    lines = [
        f"Median ms per forward pass, sequence {seq}, {threads} threads, CPU; each cell a fresh process.",
        "",
        "| task | model | params | size fp32 / opt / int8 (MB) | batch | "
        + " | ".join(ENGINES)
        + " | ORT fp32 ÷ torch | int8 ÷ fp32 | opt ÷ fp32 |",
        "|---|---|---|---|---|" + "---|" * (len(ENGINES) + 3),
    ]
    for row in rows:
        sizes = " / ".join(f"{row.sizes_mb.get(v, float('nan')):.1f}" for v in ENGINES[1:])
        for b in batches:
            ms = [row.ms.get((e, b)) for e in ENGINES]
            cells = " | ".join("-" if m is None else f"{m:.2f}" for m in ms)
            torch_ms, fp32, opt, int8 = (row.ms.get((e, b)) for e in ("torch", "fp32", "optimized", "int8"))
            lines.append(
                f"| {row.task} | {row.role} | {row.params:,} | {sizes} | {b} | {cells} | "
                f"{_ratio(torch_ms, fp32)} | {_ratio(fp32, int8)} | {_ratio(fp32, opt)} |"
            )
    return "\n".join(lines) + "\n"


def plot(rows: list[Row], batches: tuple[int, ...], out: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, len(batches), figsize=(7 * len(batches), 0.45 * len(rows) * len(ENGINES) + 2))
    for ax, b in zip(np.atleast_1d(axes), batches, strict=True):
        labels = [f"{r.task}\n{r.role}" for r in rows]
        y = np.arange(len(rows))
        height = 0.8 / len(ENGINES)
        for i, engine in enumerate(ENGINES):
            values = [r.ms.get((engine, b), np.nan) for r in rows]
            ax.barh(y + i * height, values, height, label=engine)
        ax.set_yticks(y + 0.4 - height / 2, labels)
        ax.invert_yaxis()
        ax.set_xlabel("ms per forward pass (lower is better)")
        ax.set_title(f"batch {b}")
        ax.legend()
    fig.tight_layout()
    fig.savefig(out, dpi=110)


app = typer.Typer(add_completion=False, help=__doc__)


@app.command("measure")
def measure_command(
    engine: str,
    target: Path,
    batch: int = 1,
    seq: int = 128,
    threads: int = 2,
) -> None:
    """One measurement (used internally: each one runs in a fresh process)."""
    print(measure(engine, str(target), batch, seq, threads))


@app.command("run")
def run_command(
    demo: Annotated[Path, typer.Option(help="Output of `python -m training demo`.")] = Path("build/demo"),
    out: Annotated[Path, typer.Option(help="Markdown file to write the table into.")] = Path(
        "docs/engine_benchmark.md"
    ),
    seq: int = 128,
    threads: Annotated[int, typer.Option(help="Threads per engine (torch and ORT alike).")] = 2,
) -> None:
    """Export every demo teacher and student, then time torch vs every ORT variant at batch 1 and 32."""
    batches = (1, 32)
    pairs = [
        (d.name, role)
        for d in sorted(demo.iterdir())
        if (d / "student").is_dir()
        for role in ("teacher", "student")
    ]
    rows: list[Row] = []
    with tempfile.TemporaryDirectory() as tmp, Progress(console=console) as progress:
        bar = progress.add_task("engine benchmark", total=len(pairs) * len(ENGINES) * len(batches))
        for task, role in pairs:
            model_dir = demo / task / role
            eval_file = demo / "data" / DEMO_EVAL[task]
            version = _export_all(
                model_dir, task, Path(tmp) / task / role, eval_file if eval_file.is_file() else None
            )
            manifest = json.loads((version / "manifest.json").read_text())
            sizes = {v: spec["size_bytes"] / 1e6 for v, spec in manifest["variants"].items()}
            row = Row(task, role, _params(model_dir), sizes, {})
            for engine in ENGINES:
                for b in batches:
                    progress.update(bar, description=f"{task} {role} {engine} b{b}")
                    if engine == "torch" or engine in manifest["variants"]:
                        row.ms[(engine, b)] = _spawn(
                            engine, model_dir if engine == "torch" else version, b, seq, threads
                        )
                    progress.advance(bar)
            rows.append(row)
    table = render(rows, batches, seq, threads)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(table, encoding="utf-8")
    plot(rows, batches, out.with_suffix(".png"))
    console.print(table)
    console.print(f"wrote {out} and {out.with_suffix('.png')}")


if __name__ == "__main__":
    app()
