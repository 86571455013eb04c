"""int8 recipes side by side on one exported model: agreement with fp32, accuracy, and speed, one run.

    python -m benchmarks.int8_recipes build/real/sst2/student build/real/sst2/models/sst2/1/model.onnx \\
        --task text-classification --eval-data build/real/sst2/data/eval.jsonl

Each recipe (export.variants.Int8Recipe) quantizes the same fp32 graph; every graph then answers the same
eval texts (all of them, not the parity gate's first 256), and each answer is compared with fp32's: top-1
agreement (the gate's bar is 0.99), and for classification the accuracy against the labels. Speed is the
median ms per call at batch 1 and 32, fp32 and every recipe taking turns in rounds, so that a busy machine
slows all alike; int8 / fp32 is what to read. Writes a JSON and a Markdown table under --out.
"""

from __future__ import annotations

import json
import statistics
import tempfile
import time
from pathlib import Path
from typing import Annotated, Any

import numpy as np
import typer

from common.cli import cli_app
from common.progress import ProgressLog

app = cli_app(help="int8 recipes side by side on one exported model.")

# What was tried (issue 27, point 6b): ORT dynamic quantization with weights per channel or per tensor, at
# 7 or 8 bits, with and without the embedding tables, and with BERT's feed-forward down projection (the
# MatMul after GELU) or every feed-forward MatMul left fp32; and weight-only 8-bit in blocks (MatMulNBits,
# activations quantized per block at run time), which export tries when dynamic fails the gate.
RECIPES = {
    "dynamic (default)": {},
    "8-bit weights": {"reduce_range": False},
    "per-tensor weights": {"per_channel": False},
    "embeddings fp32": {"embeddings": False},
    "FFN down fp32": {"keep_fp32": (r"layer\.\d+/output/dense/", "/mlp/down_proj/", "/mlp/c_proj/")},
    "FFN fp32": {"keep_fp32": (r"layer\.\d+/(intermediate|output)/dense/", "/mlp/")},
    "head fp32": {"keep_fp32": ("^/bert/pooler/", "^/classifier/", "^/qa_outputs/")},
    "weight-only, blocks of 128": {"method": "weight-only", "block_size": 128},
    "weight-only, blocks of 32": {"method": "weight-only", "block_size": 32},
}


def _session(path: Path, threads: int) -> Any:
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.intra_op_num_threads = threads
    return ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])


def _run(session: Any, batches: list[dict[str, np.ndarray]], outputs: tuple[str, ...]) -> list[np.ndarray]:
    names = {i.name for i in session.get_inputs()}
    return [
        np.stack(session.run(list(outputs), {k: v for k, v in b.items() if k in names}), axis=0)
        for b in batches
    ]


def _top1(result: list[np.ndarray], batches: list[dict[str, np.ndarray]], per_position: bool) -> np.ndarray:
    """[rows, outputs]: each eval row's answer per output (a class; for spans the start and the end token,
    argmax over the real positions)."""
    rows = []
    for out, b in zip(result, batches, strict=True):  # out: [outputs, batch, (seq,) classes]
        if per_position:
            masked = np.where(b["attention_mask"].astype(bool)[None], out, -np.inf)
            rows.append(masked.argmax(-1).T)  # [batch, outputs]
        else:
            rows.append(out.argmax(-1).T)
    return np.concatenate(rows)


def _ms(session: Any, feeds: dict[str, np.ndarray]) -> float:
    names = {i.name for i in session.get_inputs()}
    run_feeds = {k: v for k, v in feeds.items() if k in names}
    started = time.perf_counter()
    session.run(None, run_feeds)
    return (time.perf_counter() - started) * 1000


@app.command()
def main(
    model_dir: Annotated[Path, typer.Argument(help="The HF model directory (tokenizer, labels).")],
    fp32: Annotated[Path, typer.Argument(help="Its exported fp32 graph (model.onnx of a version).")],
    task: Annotated[str, typer.Option(help="text-classification or question-answering.")],
    eval_data: Annotated[Path, typer.Option(help="The eval file (training.data formats).")],
    limit: Annotated[int, typer.Option(help="Eval texts used.")] = 4000,
    max_length: Annotated[int, typer.Option(help="Tokens per text.")] = 128,
    rounds: Annotated[int, typer.Option(help="Speed rounds (each: every graph in turn).")] = 5,
    calls: Annotated[int, typer.Option(help="Calls per graph per round and batch size.")] = 10,
    threads: Annotated[int, typer.Option(help="ONNX Runtime intra-op threads.")] = 2,
    out: Annotated[Path, typer.Option(help="Where the JSON and Markdown go.")] = Path("docs/bench"),
) -> None:
    from transformers import AutoConfig, AutoTokenizer

    from export.tasks import SPECS, eval_inputs, eval_texts
    from export.variants import Int8Recipe, build_int8

    spec = SPECS[task]
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    batches = eval_inputs(spec, tokenizer, eval_data, max_length, limit=limit, batch_size=32)
    labels: np.ndarray | None = None
    if task == "text-classification":
        from training.data.loaders import load_classification

        data = load_classification(eval_data)
        id2label = AutoConfig.from_pretrained(model_dir).id2label
        model_ids = {name: int(i) for i, name in id2label.items()}
        labels = np.array([model_ids[data.label_names[e.label]] for e in data.examples[:limit]])
    n_texts = len(eval_texts(spec, eval_data, limit))

    work = Path(tempfile.mkdtemp(prefix="int8-recipes-"))
    graphs = {"fp32": fp32}
    with ProgressLog("int8 recipes: quantize", len(RECIPES), unit="graphs") as log:
        for name, options in RECIPES.items():
            graphs[name] = work / f"{len(graphs)}.onnx"
            build_int8(fp32, graphs[name], Int8Recipe(name, **options))  # type: ignore[arg-type]
            log.update(advance=1)
    sessions = {name: _session(path, threads) for name, path in graphs.items()}
    answers = {}
    with ProgressLog("int8 recipes: eval", len(sessions), unit="graphs") as log:
        for name, session in sessions.items():
            answers[name] = _top1(_run(session, batches, spec.outputs), batches, spec.per_position)
            log.update(advance=1)

    one = {k: v[:1] for k, v in batches[0].items()}
    full = max(batches, key=lambda b: b["input_ids"].shape[0])
    times: dict[str, dict[str, list[float]]] = {name: {"1": [], "32": []} for name in sessions}
    with ProgressLog("int8 recipes: speed", rounds, unit="rounds") as log:
        for _ in range(rounds):
            for name, session in sessions.items():
                for size, feeds in (("1", one), ("32", full)):
                    _ms(session, feeds)  # warm
                    times[name][size] += [_ms(session, feeds) for _ in range(calls)]
            log.update(advance=1)

    reference = answers["fp32"]
    rows = []
    for name in sessions:
        same = (answers[name] == reference).all(axis=-1)
        row: dict[str, Any] = {
            "recipe": name,
            "size_mb": round(graphs[name].stat().st_size / 1e6, 1),
            "agreement": float(same.mean()),
            "flips": int((~same).sum()),
            "b1_ms": statistics.median(times[name]["1"]),
            "b32_ms": statistics.median(times[name]["32"]),
        }
        if labels is not None:
            row["accuracy"] = float((answers[name][:, 0] == labels).mean())
        rows.append(row)
    base = rows[0]
    for row in rows:
        row["speedup_b1"] = base["b1_ms"] / row["b1_ms"]
        row["speedup_b32"] = base["b32_ms"] / row["b32_ms"]

    out.mkdir(parents=True, exist_ok=True)
    stem = f"int8-recipes-{model_dir.parent.name}-{model_dir.name}"
    result = {
        "model": str(model_dir),
        "fp32": str(fp32),
        "eval": str(eval_data),
        "texts": n_texts,
        "threads": threads,
        "rows": rows,
    }
    (out / f"{stem}.json").write_text(json.dumps(result, indent=2) + "\n")
    head = (
        "| recipe | size MB | agreement with fp32 | flips | accuracy | b1 ms | b32 ms | speed-up b1 / b32 |"
    )
    lines = [
        f"{n_texts} eval texts of {eval_data}, {threads} threads",
        "",
        head,
        "|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        accuracy = f"{r['accuracy']:.4f}" if "accuracy" in r else "-"
        lines.append(
            f"| {r['recipe']} | {r['size_mb']} | {r['agreement']:.4f} | {r['flips']} | {accuracy} | "
            f"{r['b1_ms']:.2f} | {r['b32_ms']:.1f} | {r['speedup_b1']:.2f}x / {r['speedup_b32']:.2f}x |"
        )
    (out / f"{stem}.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    app()
