"""The reports a run leaves beside its model: what was trained, on what, how well, how fast, from which code.

`distill_report.json` (student dir) is what export/ copies into the manifest's distillation record;
`train_report.json` (teacher dir) records the teacher's own run. Each has a short Markdown twin for people.
"""

from __future__ import annotations

import copy
import json
import statistics
import time
from collections.abc import Mapping, Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import torch
import torch.nn as nn

from common.provenance import sha256_of

DISTILL_REPORT = "distill_report.json"
TRAIN_REPORT = "train_report.json"
GENERAL_REPORT = "general_report.json"  # a student after general distillation (training/general.py)


def now() -> str:
    return datetime.now(UTC).isoformat(timespec="seconds")


@torch.inference_mode()
def latency_ms(
    model: nn.Module,
    inputs: Mapping[str, torch.Tensor],
    *,
    batch_sizes: Sequence[int] = (1, 32),
    runs: int = 5,
) -> dict[str, float]:
    """Median PyTorch CPU forward time per batch size, in ms (tokenisation excluded), after one warm-up.

    `inputs` is one batch of model inputs; each measured batch is its first rows (cycled when there are
    fewer), cut to their longest real sequence, as a client's batch of that size would be padded.
    """
    cpu_model = model if next(model.parameters()).device.type == "cpu" else copy.deepcopy(model).cpu()
    was_training = cpu_model.training
    cpu_model.eval()
    available = next(iter(inputs.values())).size(0)
    result: dict[str, float] = {}
    for size in batch_sizes:
        index = torch.arange(size) % available
        batch = {key: value[index].cpu() for key, value in inputs.items()}
        if "attention_mask" in batch:
            width = int(batch["attention_mask"].sum(1).max())
            batch = {key: value[:, :width] if value.dim() == 2 else value for key, value in batch.items()}
        cpu_model(**batch)
        times = []
        for _ in range(runs):
            started = time.perf_counter()
            cpu_model(**batch)
            times.append((time.perf_counter() - started) * 1000)
        result[f"batch_{size}"] = round(statistics.median(times), 3)
    cpu_model.train(was_training)
    return result


def file_sha256(path: str | Path) -> str | None:
    """Checksum of a data file, so a report says exactly which data it was trained on (None if unreadable)."""
    try:
        return sha256_of(Path(path))
    except OSError:
        return None


def write_report(out_dir: str | Path, name: str, report: dict[str, Any]) -> Path:
    """Write `name` (JSON) and its Markdown twin into out_dir; returns the JSON path."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    path = out / name
    path.write_text(json.dumps(report, indent=2) + "\n", encoding="utf-8")
    path.with_suffix(".md").write_text(to_markdown(report), encoding="utf-8")
    return path


def _fmt(value: Any) -> str:
    if isinstance(value, float):
        return f"{value:.4f}"
    if isinstance(value, int):
        return f"{value:,}"
    return "—" if value is None else str(value)


def to_markdown(report: dict[str, Any]) -> str:
    """One table row per model: score, size, latency; then the recipe and provenance."""
    metric = report.get("metric", "score")
    if "higher_is_better" in report:
        metric += " (higher is better)" if report["higher_is_better"] else " (lower is better)"
    lines = [f"# {report.get('task', 'training')} run", ""]
    lines += [
        f"| model | {metric} | params | layers | PyTorch CPU b1 (ms) | PyTorch CPU b32 (ms) |",
        "|---|---|---|---|---|---|",
    ]
    latency = report.get("latency_ms", {})
    for role in ("teacher", "student"):
        if role not in report:
            continue
        entry, lat = report[role], latency.get(role, {})
        cells = [
            entry.get("score"),
            entry.get("params"),
            entry.get("layers"),
            lat.get("batch_1"),
            lat.get("batch_32"),
        ]
        lines.append(f"| {role} | " + " | ".join(_fmt(c) for c in cells) + " |")
    lines.append("")
    if "agreement" in report:
        lines.append(f"Student-teacher top-1 agreement: {_fmt(report['agreement'])}")
        lines.append("")
    for split in ("train", "eval"):
        if split in report:
            lines.append(f"- {split}: {report[split]['source']} ({report[split]['examples']:,} examples)")
    lines.append("- recipe: " + ", ".join(f"{k}={v}" for k, v in report.get("recipe", {}).items()))
    lines.append(f"- git revision: {_fmt(report.get('git_revision'))}; created {report.get('created_at')}")
    return "\n".join(lines) + "\n"


def read_report(model_dir: str | Path, name: str = TRAIN_REPORT) -> dict[str, Any] | None:
    path = Path(model_dir) / name
    return json.loads(path.read_text(encoding="utf-8")) if path.is_file() else None
