"""Which of a decoder call's positions get logits: the graph input `logit_positions` [rows, n] names, per
row, the columns of the call's new positions whose vocabulary scores come out; `logits` is [rows, n, vocab].

Why: a prefill uses one position's logits a prompt (the last, for its first token) but a graph without the
input scores every position against the whole vocabulary. For SmolLM2-135M the output head is 28 M of its
134 M parameters, ~21 % of a prefill's multiplies, and the logits of four 2,048-token prompts in one call
are 1.6 GB (the reason prompts are prefilled in chunks). Graphs written by distilserve's export
(export/appending_decoder.py, export/llama_graph.py) declare the input; the runner feeds it where the graph
has it, every position where it needs them all (prompt log-probabilities, a teacher checking drafts).
"""

from __future__ import annotations

import numpy as np

LOGIT_POSITIONS = "logit_positions"


def every_position(rows: int, width: int) -> np.ndarray:
    """[rows, width]: logits at each of the call's positions, as a graph without the input returns them."""
    return np.tile(np.arange(width, dtype=np.int64), (rows, 1))


def last_position(rows: int, width: int) -> np.ndarray:
    """[rows, 1]: logits at the call's last column only (every row fed `width` real positions)."""
    return np.full((rows, 1), width - 1, dtype=np.int64)


def ending_positions(lengths: np.ndarray, start: int, end: int) -> np.ndarray:
    """[rows, 1]: for right-padded prompts of `lengths` run over columns [start, end), each one's last
    position where it ends in the chunk (clamped into it otherwise: a row that ends elsewhere needs none)."""
    return np.clip(np.asarray(lengths, dtype=np.int64) - 1 - start, 0, end - start - 1)[:, None]
