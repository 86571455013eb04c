"""Prompts prefilled together: right-padded into one array of columns, run a chunk of columns a call, each
chunk's keys and values the next one's past; a prompt that begins with cached blocks (prefix_cache.py) runs
only the rest, its cached positions the past's first columns."""

from __future__ import annotations

from collections.abc import Sequence as Seq
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from service.generation.prefix_cache import PrefixCache, PrefixHit
from service.generation.sampling import Logprob
from service.generation.sequence import Sequence
from service.generation.slot_cache import LayerCache
from service.manifest import GenerationLayout


@dataclass
class PromptBatch:
    """Prompts prefilled together, right-padded: their keys and values so far, and the prompt
    log-probabilities gathered for rows whose first token is still to come.

    A row whose prompt begins with cached blocks (prefix_cache.py) runs only the rest: `cached` tokens
    of it are the past's first columns, left-aligned and padded to the longest (`past_mask`), and the
    columns run so far follow them ([0, start) of `ids`)."""

    seqs: list[Sequence]
    ids: np.ndarray  # [rows, width]: each prompt's tokens after its cached ones
    mask: np.ndarray
    positions: np.ndarray
    past: list[tuple[Any, Any]]
    start: int = 0  # the next column to run
    prompt_logprobs: dict[int, list[Logprob]] = field(default_factory=dict)
    cached: np.ndarray = field(default_factory=lambda: np.zeros(0, dtype=np.int64))  # [rows]
    past_mask: np.ndarray = field(default_factory=lambda: np.zeros((0, 0), dtype=np.int64))  # [rows, cached]

    @classmethod
    def of(
        cls, seqs: Seq[Sequence], layout: GenerationLayout, prefixes: PrefixCache | None = None
    ) -> PromptBatch:
        """`prefixes`: where each prompt's cached blocks are looked up (none for a prompt whose
        log-probabilities are asked: every position of it is run)."""
        hits: list[PrefixHit | None] = [
            prefixes.longest(s.prompt) if prefixes is not None and s.params.prompt_logprobs is None else None
            for s in seqs
        ]
        cached = np.array([h.tokens if h is not None else 0 for h in hits], dtype=np.int64)
        rest = [s.prompt[c:] for s, c in zip(seqs, cached, strict=True)]
        width = max(len(r) for r in rest)
        ids = np.zeros((len(seqs), width), dtype=np.int64)
        mask = np.zeros((len(seqs), width), dtype=np.int64)
        for row, r in enumerate(rest):
            ids[row, : len(r)] = r
            mask[row, : len(r)] = 1
        positions = np.clip(np.cumsum(mask, axis=1) - 1, 0, None) + cached[:, None]
        columns = int(cached.max())
        past_mask = (np.arange(columns)[None] < cached[:, None]).astype(np.int64)
        shape = (len(seqs), layout.num_key_value_heads, columns, layout.head_dim)
        past = [(np.zeros(shape, np.float32), np.zeros(shape, np.float32)) for _ in range(layout.num_layers)]
        for row, hit in enumerate(hits):
            if hit is not None:
                for (keys, values), (k, v) in zip(past, hit.layers, strict=True):
                    keys[row, :, : hit.tokens], values[row, :, : hit.tokens] = k, v
        return cls(list(seqs), ids, mask, positions, past, cached=cached, past_mask=past_mask)

    @property
    def width(self) -> int:
        return int(self.ids.shape[1])

    @property
    def lengths(self) -> np.ndarray:
        """Each row's tokens to run: its prompt's, less those cached."""
        return np.array([len(s.prompt) for s in self.seqs], dtype=np.int64) - self.cached

    def mask_to(self, end: int) -> np.ndarray:
        """The attention mask of a call running columns up to `end`: the cached past's, then the prompt's."""
        return np.concatenate([self.past_mask, self.mask[:, :end]], axis=1)

    def row_cache(self, presents: list[tuple[Any, Any]], row: int, end: int) -> list[LayerCache]:
        """A finished row's keys and values, its positions only (cached then run), from `presents` [rows,
        kv heads, cached columns + end, head dim]."""
        if (self.cached == self.past_mask.shape[1]).all():  # every past column cached: no gap before the run
            n = len(self.seqs[row].prompt)
            return [(k[row, :, :n], v[row, :, :n]) for k, v in presents]
        columns = np.flatnonzero(self.mask_to(end)[row])
        return [(k[row][:, columns], v[row][:, columns]) for k, v in presents]

    @property
    def done(self) -> bool:
        """Every column run: each prompt through the model."""
        return self.start >= self.width

    def has(self, seq: Sequence) -> bool:
        """Whether `seq` is one of this batch's prompts."""
        return any(s.id == seq.id for s in self.seqs)

    def keep(self, seqs: Seq[Sequence]) -> None:
        """Only the rows of `seqs`, in their order (a prompt done or abandoned leaves)."""
        if [s.id for s in seqs] == [s.id for s in self.seqs]:
            return
        row_of = {s.id: row for row, s in enumerate(self.seqs)}
        rows = np.array([row_of[s.id] for s in seqs])
        self.ids, self.mask, self.positions = self.ids[rows], self.mask[rows], self.positions[rows]
        self.past = [(keys[rows], values[rows]) for keys, values in self.past]
        self.cached, self.past_mask = self.cached[rows], self.past_mask[rows]
        self.seqs = list(seqs)
        kept = {s.id for s in seqs}
        self.prompt_logprobs = {i: lp for i, lp in self.prompt_logprobs.items() if i in kept}
