"""Fill-mask graphs side by side: optimum's (logits at every position) vs distilserve's mask-scoring graph.

    python -m benchmarks.fill_mask_bench --out docs/bench/fill-mask.md [--device cuda]

A masked LM of all-MiniLM-L6-v2's shape (6 x 384) with BERT's 30,522-token vocabulary and random weights
(speed only: no hub), exported both ways, each as fp32 and int8 (the CPU default), then timed with ONNX
Runtime at a few batch shapes, numpy in and out as the service calls it. The two graphs alternate within
each round (this machine's speed drifts over minutes), and the median of the rounds is reported with the
ratio per shape. Every row holds one mask token.
"""

from __future__ import annotations

import statistics
import tempfile
import time
from pathlib import Path
from typing import Annotated

import numpy as np
import typer
from rich.console import Console

from benchmarks.shapes import MINILM_BERT_CONFIG
from common.cli import one_command_app
from common.progress import ProgressLog

console = Console(stderr=True)
SHAPES = ((1, 24), (8, 32), (32, 32), (8, 128))  # (texts, tokens each)
MASK_ID = 103  # BERT's [MASK]


def export_both(work: Path) -> dict[str, Path]:
    """{graph-variant: path} for optimum's graph and the mask-scoring graph, fp32 and int8 each."""
    from optimum.exporters.onnx import main_export
    from transformers import BertConfig, BertForMaskedLM, BertTokenizerFast

    from export.onnx_export import export_onnx
    from export.variants import build_int8

    model_dir = work / "hf"
    config = BertConfig(**MINILM_BERT_CONFIG)
    BertForMaskedLM(config).save_pretrained(model_dir)
    vocab = model_dir / "vocab.txt"  # a WordPiece vocabulary with [MASK] at BERT's id
    specials = {0: "[PAD]", 100: "[UNK]", 101: "[CLS]", 102: "[SEP]", MASK_ID: "[MASK]"}
    vocab.write_text("\n".join(specials.get(i, f"tok{i}") for i in range(config.vocab_size)) + "\n")
    BertTokenizerFast(vocab_file=str(vocab)).save_pretrained(model_dir)
    graphs = {}
    console.print("exporting optimum's fill-mask graph")
    main_export(str(model_dir), output=work / "optimum", task="fill-mask", do_validation=False)
    graphs["optimum"] = work / "optimum" / "model.onnx"
    console.print("exporting the mask-scoring graph")
    graphs["mask-scoring"] = export_onnx(model_dir, "fill-mask", work / "mask-scoring")
    for name in list(graphs):
        console.print(f"building int8 of {name}")
        graphs[f"{name} int8"] = work / f"{name}.int8.onnx"
        build_int8(graphs[name], graphs[f"{name} int8"])
    return graphs


def time_graph(path: Path, device: str, seconds: float) -> dict[tuple[int, int], float]:
    """Median ms per call at each shape."""
    import onnxruntime as ort

    providers = ["CUDAExecutionProvider"] if device == "cuda" else ["CPUExecutionProvider"]
    session = ort.InferenceSession(str(path), providers=providers)
    names = {i.name for i in session.get_inputs()}
    rng = np.random.default_rng(0)
    times = {}
    for batch, length in SHAPES:
        ids = rng.integers(1000, 30000, size=(batch, length))
        ids[:, length // 3] = MASK_ID
        feeds = {"input_ids": ids, "attention_mask": np.ones_like(ids), "token_type_ids": np.zeros_like(ids)}
        feeds = {k: v for k, v in feeds.items() if k in names}
        for _ in range(3):
            session.run(None, feeds)
        calls: list[float] = []
        until = time.perf_counter() + seconds
        while time.perf_counter() < until or len(calls) < 5:
            started = time.perf_counter()
            session.run(None, feeds)
            calls.append(time.perf_counter() - started)
        times[(batch, length)] = statistics.median(calls) * 1000
    return times


def main(
    out: Annotated[Path, typer.Option(help="Markdown table to write.")] = Path("docs/bench/fill-mask.md"),
    device: Annotated[str, typer.Option(help="cpu or cuda.")] = "cpu",
    rounds: Annotated[int, typer.Option(help="Alternating rounds; the median is reported.")] = 3,
    seconds: Annotated[float, typer.Option(help="Seconds per graph and shape in each round.")] = 1.5,
) -> None:
    with tempfile.TemporaryDirectory(prefix="fill-mask-bench-") as tmp:
        graphs = export_both(Path(tmp))
        runs: dict[str, list[dict[tuple[int, int], float]]] = {name: [] for name in graphs}
        timings = rounds * len(graphs)
        with ProgressLog.beside(console, "fill-mask bench", timings, unit="timings") as progress_log:
            for r in range(rounds):
                for name, path in graphs.items():
                    progress_log.update(status=f"round {r + 1}: {name}")
                    runs[name].append(time_graph(path, device, seconds))
                    progress_log.update(advance=1)
                    console.print(
                        f"round {r + 1}: {name} " + ", ".join(f"{v:.2f}" for v in runs[name][-1].values())
                    )
    median = {
        name: {shape: statistics.median(run[shape] for run in per_round) for shape in SHAPES}
        for name, per_round in runs.items()
    }
    header = " | ".join(f"{b} x {n} tokens" for b, n in SHAPES)
    lines = [
        f"# Fill-mask graphs on {device}: ms per call (median of {rounds} alternating rounds)",
        "",
        "MiniLM-shaped masked LM (6 x 384), BERT's 30,522-token vocabulary, one mask a text "
        "(`python -m benchmarks.fill_mask_bench`).",
        "",
        f"| graph | {header} |",
        "|---|" + "---|" * len(SHAPES),
    ]
    for name, row in median.items():
        lines.append(f"| {name} | " + " | ".join(f"{row[s]:.2f}" for s in SHAPES) + " |")
    for precision in ("", " int8"):
        slow, fast = median[f"optimum{precision}"], median[f"mask-scoring{precision}"]
        lines.append(
            f"| optimum ÷ mask-scoring{precision} | "
            + " | ".join(f"**{slow[s] / fast[s]:.2f}x**" for s in SHAPES)
            + " |"
        )
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text("\n".join(lines) + "\n", encoding="utf-8")
    console.print("\n".join(lines), soft_wrap=True)  # markdown to copy: never wrapped


app = one_command_app(main)

if __name__ == "__main__":
    app()
