"""A draft's output head cut to its vocabulary's first tokens plus the tokens of the running contexts: the
contract between the graph export/draft_head.py writes and the service's speculative decoding.

A draft's decode step reads its whole output head: SmolLM2's 12-layer student, 8-bit, reads 31 of its 73 MB
a step there (49,152 rows). Its teacher checks every token, so the draft may propose from fewer: the
vocabulary's first `head_tokens` ids (a byte-level BPE numbers its tokens in merge order, most frequent
first) and whatever tokens the contexts hold (names and numbers a continuation copies are rare tokens: cut
to the first 8,192 alone, SmolLM2's draft kept 2.42 tokens a teacher step against 2.59 with all 49,152;
with the contexts' tokens too, 2.61, and 2.67 at 1,024). The graph takes the extra ids as an input
(`CONTEXT_INPUT`, [c]) and returns logits [rows, positions, head_tokens + c]: the first columns score ids
0 .. head_tokens - 1, the rest the given ids in order.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass

import numpy as np

CONTEXT_INPUT = "context_token_ids"
HEAD_TOKENS_KEY = "distilserve.head_tokens"  # the graph's metadata: how many first ids its head scores


@dataclass(frozen=True)
class DraftHead:
    """A cut head: it scores ids 0 .. tokens - 1 and the context's ids fed with each call, of a model whose
    vocabulary has `vocabulary` tokens."""

    tokens: int
    vocabulary: int

    def context(self, contexts: Iterable[Sequence[int]]) -> np.ndarray:
        """The contexts' distinct ids the head does not score by itself (from `tokens` on), sorted."""
        ids = [np.asarray(tokens, dtype=np.int64) for tokens in contexts]
        held = np.unique(np.concatenate(ids)) if ids else np.zeros(0, dtype=np.int64)
        return held[held >= self.tokens]

    def columns(self, context: np.ndarray) -> np.ndarray:
        """The token id each logit column scores when `context` was fed."""
        return np.concatenate([np.arange(self.tokens, dtype=np.int64), context])

    def every_token(self) -> np.ndarray:
        """The context that makes the head score every token, in id order (as the uncut head does)."""
        return np.arange(self.tokens, self.vocabulary, dtype=np.int64)

    def whole(self, logits: np.ndarray, columns: np.ndarray) -> np.ndarray:
        """One position's logits over the whole vocabulary: the columns' scores, -inf (probability 0) for
        the tokens the head did not score."""
        out = np.full(self.vocabulary, -np.inf, dtype=np.float32)
        out[columns] = logits
        return out
