"""One decoder served from two graphs that compute the same function: its int4 graph (a model 4-bit at its
source, export/source_blocks.py) for the engine calls of few rows, its fp32 graph for the rest.

The int4 graph reads an eighth of the weights' bytes, which is what a decode step of one row costs on a CPU;
with more rows, and in a prefill, ONNX Runtime unpacks its 4-bit blocks at every call and fp32 is faster
(SmolLM2 served: int4 alone 1.46x fp32's tokens/s at 1 stream, 0.85x at 16; split, 1.35x and 1.04x). Both
graphs give fp32's answers, so a sequence may be prefilled by one and decoded by the other: each call goes
to the graph that runs it faster, by its rows (sequences x new positions) against a line timed at start-up.
Both graphs are held, so this costs memory; DISTILSERVE_VARIANT=int4 serves int4 alone, at two thirds of
fp32's.
"""

from __future__ import annotations

import logging
from collections.abc import Callable

import numpy as np

from service.engine import Engine
from service.generation.tuning import decode_step_s
from service.manifest import GenerationLayout

log = logging.getLogger(__name__)

ROWS_TRIED = (1, 4, 8, 16)  # a decode step's rows, timed in this order until int4 stops being faster


class RowSplitEngine:
    """`narrow` for calls of at most `rows` rows x positions, `wide` for the rest (the same inputs and
    outputs: two exports of one model)."""

    def __init__(self, narrow: Engine, wide: Engine, rows: int) -> None:
        self.narrow, self.wide, self.rows = narrow, wide, rows

    @property
    def provider(self) -> str:
        return self.wide.provider

    @property
    def input_names(self) -> list[str]:
        return self.wide.input_names

    def run(self, feeds: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        return (self.narrow if feeds["input_ids"].size <= self.rows else self.wide).run(feeds)


def narrow_rows(
    time_step: Callable[[Engine, int], float],
    narrow: Engine,
    wide: Engine,
    tried: tuple[int, ...] = ROWS_TRIED,
) -> int:
    """The most rows of `tried` at which `narrow` runs a decode step faster than `wide` (0: not even one);
    each count timed on both, in turn, until narrow loses."""
    faster = 0
    for rows in tried:
        if time_step(narrow, rows) >= time_step(wide, rows):
            break
        faster = rows
    return faster


def split_decoder(int4: Engine, fp32: Engine, layout: GenerationLayout, name: str, max_rows: int) -> Engine:
    """int4 alone where it is faster at every row count tried, fp32 alone where not even at one row, else
    the two split at the line (timing failures keep int4, the variant chosen)."""
    prompt = 16

    def time_step(engine: Engine, rows: int) -> float:
        return decode_step_s(engine, layout, rows, prompt, steps=4)

    tried = tuple(r for r in ROWS_TRIED if r <= max_rows) or (1,)
    try:
        rows = narrow_rows(time_step, int4, fp32, tried)
    except Exception as e:  # a failing timing leaves the chosen variant in place
        log.warning("%s: timing int4 against fp32 failed (%s); int4 alone", name, e)
        return int4
    if rows >= tried[-1]:
        log.info("%s: int4 decodes faster at every batch tried: int4 alone", name)
        return int4
    if rows == 0:
        log.info("%s: fp32 decodes faster even one row at a time: fp32 alone", name)
        return fp32
    log.info("%s: calls of up to %d rows on int4, wider ones (and prefills) on fp32", name, rows)
    return RowSplitEngine(int4, fp32, rows)
