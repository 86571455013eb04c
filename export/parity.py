"""The parity gate: an ONNX variant is written only if it matches the PyTorch model it came from."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import onnxruntime as ort

Feeds = dict[str, np.ndarray]


@dataclass(frozen=True)
class ParityReport:
    max_abs_diff: float
    top1_agreement: float
    rows: int

    def as_dict(self) -> dict[str, float]:
        return {"max_abs_diff": self.max_abs_diff, "top1_agreement": self.top1_agreement, "rows": self.rows}


@dataclass(frozen=True)
class ParityBounds:
    """fp32 must be numerically the same model; quantized variants must agree on the answer."""

    max_abs_diff: float | None
    min_top1_agreement: float

    def failures(self, report: ParityReport) -> list[str]:
        problems = []
        if self.max_abs_diff is not None and report.max_abs_diff > self.max_abs_diff:
            problems.append(f"max |diff| {report.max_abs_diff:.2e} > {self.max_abs_diff:.0e}")
        if report.top1_agreement < self.min_top1_agreement:
            problems.append(f"top-1 agreement {report.top1_agreement:.4f} < {self.min_top1_agreement}")
        return problems


BOUNDS: dict[str, ParityBounds] = {
    "fp32": ParityBounds(max_abs_diff=1e-4, min_top1_agreement=0.99),
    "int8": ParityBounds(max_abs_diff=None, min_top1_agreement=0.99),
    "fp16": ParityBounds(max_abs_diff=None, min_top1_agreement=0.995),
}


def generated_batches(
    vocab_size: int,
    special_ids: Sequence[int],
    max_length: int,
    *,
    cls_id: int | None,
    sep_id: int | None,
    pad_id: int,
    seed: int = 0,
    batch_sizes: Sequence[int] = (1, 4, 16),
    with_token_types: bool = True,
) -> list[Feeds]:
    """Right-padded batches of random ordinary tokens with varied lengths (1 .. max_length)."""
    rng = np.random.default_rng(seed)
    ordinary = np.setdiff1d(np.arange(vocab_size), np.asarray(list(special_ids), dtype=np.int64))
    frame = int(cls_id is not None) + int(sep_id is not None)
    batches: list[Feeds] = []
    for size in batch_sizes:
        lengths = rng.integers(frame + 1, max_length + 1, size=size)
        lengths[0] = max_length  # always exercise the longest shape
        width = int(lengths.max())
        ids = np.full((size, width), pad_id, dtype=np.int64)
        mask = np.zeros((size, width), dtype=np.int64)
        for row, n in enumerate(lengths):
            body = rng.choice(ordinary, size=int(n) - frame)
            framed = (
                ([cls_id] if cls_id is not None else [])
                + body.tolist()
                + ([sep_id] if sep_id is not None else [])
            )
            ids[row, :n] = framed
            mask[row, :n] = 1
        feeds: Feeds = {"input_ids": ids, "attention_mask": mask}
        if with_token_types:
            feeds["token_type_ids"] = np.zeros_like(ids)
        batches.append(feeds)
    return batches


def compare(
    reference: Callable[[Feeds], np.ndarray], onnx_path: Path, batches: Sequence[Feeds], output: str
) -> ParityReport:
    """Max |ORT - reference| over real (unpadded) positions and top-1 agreement of the last axis."""
    session = ort.InferenceSession(str(onnx_path), providers=["CPUExecutionProvider"])
    names = {i.name for i in session.get_inputs()}
    worst, agree, rows = 0.0, 0, 0
    for feeds in batches:
        expected = reference(feeds)
        got = session.run([output], {k: v for k, v in feeds.items() if k in names})[0]
        if expected.ndim == 3:  # token-level logits: compare real positions only
            keep = feeds["attention_mask"].astype(bool)
            expected, got = expected[keep], got[keep]
        worst = max(worst, float(np.abs(got.astype(np.float64) - expected).max()))
        agree += int((got.argmax(-1) == expected.argmax(-1)).sum())
        rows += int(expected.shape[0])
    return ParityReport(max_abs_diff=worst, top1_agreement=agree / rows, rows=rows)
