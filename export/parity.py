"""The parity gate: an ONNX variant is written only if it matches the PyTorch model it came from.

PyTorch runs once over every parity batch; each variant's ONNX Runtime outputs are then compared with
those reference outputs on the real (unpadded) positions only.

Random tokens test numerics, not answers: an fp32 graph must reproduce PyTorch's numbers on any input, but
a reduced-precision variant is judged only by whether it gives the same answers, and agreeing on random
tokens (where one class or token often wins by a wide margin) says nothing of real inputs: a real SQuAD
student's int8 agreed 1.0000 on 21 random rows with a max |diff| of 0.59. Such a variant is "not
checked" without eval data, and not written.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

Feeds = dict[str, np.ndarray]
Outputs = dict[str, np.ndarray]


NOT_CHECKED = "not checked"  # how a rejected variant's reason starts when no eval data could judge it


@dataclass(frozen=True)
class ParityReport:
    """max |diff| over all parity inputs; top-1 agreement on the eval set when given, else on all inputs."""

    max_abs_diff: float
    top1_agreement: float
    rows: int
    greedy_match: float | None = None  # generation: share of prompts continued exactly like generate()
    eval_rows: int = 0  # real eval rows the agreement was measured on; 0: random tokens only
    reference_scale: float = 1.0  # the largest |output| PyTorch gave on the compared positions
    min_cosine: float | None = None  # embeddings: the lowest row cosine with PyTorch's, on the counted rows
    single_logit: bool = False  # one output column (a cross-encoder's relevance): its value is the answer

    def as_dict(self) -> dict[str, float]:
        out = {
            "max_abs_diff": self.max_abs_diff,
            "top1_agreement": self.top1_agreement,
            "rows": float(self.rows),
            "eval_rows": float(self.eval_rows),
            "reference_scale": self.reference_scale,
        }
        if self.greedy_match is not None:
            out["greedy_match"] = self.greedy_match
        if self.min_cosine is not None:
            out["min_cosine"] = self.min_cosine
        return out


@dataclass(frozen=True)
class ParityBounds:
    """fp32 graphs must be numerically the same model; reduced precision must agree on the answers.

    `max_abs_diff` is per unit of the outputs' scale (the largest |output| PyTorch gave, at least 1):
    float32 rounding grows with the numbers summed. SmolLM2-135M's logits reach 39; ONNX Runtime's fp32
    graph differed from PyTorch by up to 5.3e-4 (1.4e-5 of that scale) with every top-1 and greedy
    continuation equal, and PyTorch's own two attention kernels differ by 6.6e-5 on the same texts."""

    max_abs_diff: float | None
    min_top1_agreement: float
    min_greedy_match: float | None = None
    # Embeddings have no top-1: a row agrees when its cosine with PyTorch's is at least this, and every
    # counted row must (a sentence's neighbours move once its vector turns).
    min_cosine: float = 0.999
    # A single logit ranks documents by its value, which the side of zero says little of: it may move by at
    # most this share of the logits' scale. The SQuAD reranker of docs/benchmarks.md: fp16 moved its logits
    # by up to 0.012 (0.4 %), int8 by 1.1 (33 %) with every sign kept. Its served recall@1 barely changed
    # (0.7776 both), but a third of the scale reorders close documents; a gate on the ranking itself (the
    # same best document per query) would judge that directly.
    max_relative_logit_diff: float = 0.02

    @property
    def judges_answers_only(self) -> bool:
        """No bound on |diff|: only the answers are compared, which needs real inputs to mean anything."""
        return self.max_abs_diff is None

    def failures(self, report: ParityReport, require_eval_data: bool = True) -> list[str]:
        """Why `report` fails these bounds; a variant judged on answers alone fails without eval rows."""
        if require_eval_data and self.judges_answers_only and report.eval_rows == 0:
            return [
                f"{NOT_CHECKED}: no eval data (--eval-data) to compare its answers with fp32's on real "
                f"inputs; on {report.rows} rows of random tokens top-1 agreement was "
                f"{report.top1_agreement:.4f} with a max |diff| of {report.max_abs_diff:.2g}, "
                "which says nothing of real inputs"
            ]
        problems = []
        allowed = None if self.max_abs_diff is None else self.max_abs_diff * max(1.0, report.reference_scale)
        if allowed is not None and report.max_abs_diff > allowed:
            problems.append(
                f"max |diff| {report.max_abs_diff:.2e} > {allowed:.1e} ({self.max_abs_diff:.0e} x the "
                f"largest |output| {report.reference_scale:.3g}, at least 1)"
            )
        if report.min_cosine is not None:  # embeddings: every row's cosine, there is no top-1
            if report.min_cosine < self.min_cosine:
                problems.append(
                    f"a row's cosine with PyTorch's is {report.min_cosine:.5f} < {self.min_cosine}"
                )
        elif report.top1_agreement < self.min_top1_agreement:
            problems.append(f"top-1 agreement {report.top1_agreement:.4f} < {self.min_top1_agreement}")
        moved = report.max_abs_diff / max(1.0, report.reference_scale)
        if report.single_logit and report.eval_rows and moved > self.max_relative_logit_diff:
            problems.append(
                f"the relevance logit moved by {report.max_abs_diff:.3g} ({moved:.1%} of its scale "
                f"{report.reference_scale:.3g}, at most {self.max_relative_logit_diff:.0%}): rankings "
                "would change"
            )
        if (
            self.min_greedy_match is not None
            and report.greedy_match is not None
            and report.greedy_match < self.min_greedy_match
        ):
            problems.append(f"greedy continuations match {report.greedy_match:.3f} < {self.min_greedy_match}")
        return problems


BOUNDS: dict[str, ParityBounds] = {
    "fp32": ParityBounds(max_abs_diff=1e-4, min_top1_agreement=0.999, min_greedy_match=1.0),
    "optimized": ParityBounds(max_abs_diff=1e-3, min_top1_agreement=0.999),
    "fp16": ParityBounds(max_abs_diff=None, min_top1_agreement=0.995),
    "int8": ParityBounds(max_abs_diff=None, min_top1_agreement=0.99),
    # int4 holds the weights a model had at its source (export/source_blocks.py): it computes what fp32
    # does, to float rounding, and is held to fp32's answers (its numbers sum in another order).
    "int4": ParityBounds(max_abs_diff=None, min_top1_agreement=0.999, min_greedy_match=1.0),
    # A draft only proposes tokens its teacher checks (export.variants.build_draft): what it must keep is
    # enough of its own model's answers to be worth drafting with, not every one.
    "draft": ParityBounds(max_abs_diff=None, min_top1_agreement=0.85),
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
            body = rng.choice(ordinary, size=int(n) - frame).tolist()
            ids[row, :n] = (
                ([cls_id] if cls_id is not None else []) + body + ([sep_id] if sep_id is not None else [])
            )
            mask[row, :n] = 1
        feeds: Feeds = {"input_ids": ids, "attention_mask": mask}
        if with_token_types:
            feeds["token_type_ids"] = np.zeros_like(ids)
        batches.append(feeds)
    return batches


def _real(
    expected: np.ndarray, got: np.ndarray, mask: np.ndarray, per_position: bool
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(expected rows, got rows, |diff| values) with padding neither compared nor argmax'ed."""
    if not per_position:  # [batch, classes]
        return expected, got, np.abs(got.astype(np.float64) - expected)
    keep = mask.astype(bool)
    diff = np.abs(got[keep].astype(np.float64) - expected[keep])
    if expected.ndim == 3:  # [batch, seq, vocab]: every real position is a row
        return expected[keep], got[keep], diff
    # [batch, seq] span logits: one row per sequence, argmax over its real positions
    return np.where(keep, expected, -np.inf), np.where(keep, got, -np.inf), diff


def compare(
    reference: Sequence[Outputs],
    candidate: Sequence[Outputs],
    batches: Sequence[Feeds],
    names: Sequence[str],
    per_position: bool,
    agreement_batches: int | None = None,
    cosine: float | None = None,
) -> ParityReport:
    """Compare outputs batch by batch; agreement counts only the last `agreement_batches` (the eval set).

    A row agrees when the argmax of every output does: for QA, the span's start and its end, since a
    span with one end moved is a different answer to the user. A single logit (a cross-encoder's
    relevance) has no argmax to compare: its sign is, the side of 0.5 its sigmoid falls on. With `cosine`
    (embeddings, [batch, dim]), a row agrees when its cosine with PyTorch's reaches it instead, and the
    lowest is reported."""
    worst, agree, rows, scale = 0.0, 0, 0, 0.0
    lowest: float | None = None
    single = not per_position and cosine is None and all(reference[0][n].shape[-1] == 1 for n in names)
    first_counted = len(batches) - (agreement_batches or len(batches))
    for index, (expected_out, got_out, feeds) in enumerate(zip(reference, candidate, batches, strict=True)):
        hits: np.ndarray | None = None
        for name in names:
            expected, got, diff = _real(
                expected_out[name], got_out[name], feeds["attention_mask"], per_position
            )
            if diff.size:
                worst = max(worst, float(diff.max()))
                scale = max(scale, _largest(expected_out[name], feeds["attention_mask"], per_position))
            if cosine is None and expected.shape[-1] == 1:  # one logit: the decision its sigmoid makes at 0.5
                same = (got[..., 0] > 0) == (expected[..., 0] > 0)
            elif cosine is None:
                same = got.argmax(-1) == expected.argmax(-1)
            else:
                cosines = row_cosines(expected, got)
                same = cosines >= cosine
                if index >= first_counted and cosines.size:
                    low = float(cosines.min())
                    lowest = low if lowest is None else min(lowest, low)
            hits = same if hits is None else hits & same
        if index >= first_counted and hits is not None:
            agree += int(hits.sum())
            rows += int(hits.shape[0])
    return ParityReport(
        max_abs_diff=worst,
        top1_agreement=agree / max(rows, 1),
        rows=rows,
        eval_rows=rows if agreement_batches else 0,
        reference_scale=scale,
        min_cosine=lowest,
        single_logit=single,
    )


def row_cosines(expected: np.ndarray, got: np.ndarray) -> np.ndarray:
    """Each row's cosine similarity, in float64; two zero rows count as equal, one zero row as 0."""
    a, b = expected.astype(np.float64), got.astype(np.float64)
    norm_a, norm_b = np.linalg.norm(a, axis=-1), np.linalg.norm(b, axis=-1)
    norms = norm_a * norm_b
    dots = (a * b).sum(axis=-1)
    return np.where((norm_a == 0) & (norm_b == 0), 1.0, dots / np.where(norms == 0, 1.0, norms))


def _largest(expected: np.ndarray, mask: np.ndarray, per_position: bool) -> float:
    """The largest |value| of an output on the real positions (padding excluded)."""
    return float(np.abs(expected[mask.astype(bool)] if per_position else expected).max())
