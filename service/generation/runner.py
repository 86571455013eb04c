"""The runner executes a step plan on the exported decoder: batched prefill, batched decode, sampling.

Sequences of different lengths share one engine call: prompts are right-padded, the cached keys/values of
the running batch are right-padded too, and the attention mask hides every padded position while each
sequence keeps its own position ids, so a sequence computes the same logits alone or in company.

With distilserve's appending graph (GPT-2), `present` is only the new position: the batch keeps its cache
in arrays with room for ROOM more columns, writes each step's position into the next one, and widens the
arrays once every ROOM steps; the graph reads the past where it lies. With optimum's graph, `present` is
past + new (the whole cache copied inside every call) and is fed back as the next step's `past`.

Only when sequences join or leave is the batch rebuilt: the rows that stay keep their layout, gaps
included (the mask hides them), in one copy per tensor (a run of rows is copied through a view, not
gathered first), and the new rows bring their prefill caches. Columns that no staying row uses any more
are dropped only once they are a twentieth of the width. With per-sequence caches gathered every step, that
copying was a third of a decode step; compacting each staying row on its own was a sixth of the engine
thread's time under a 16-stream load, and gathering rows and columns at every join still a quarter.
"""

from __future__ import annotations

import time
from collections.abc import Sequence as Seq
from dataclasses import dataclass

import numpy as np

from service.engine import Engine
from service.generation.sampling import next_token
from service.generation.scheduler import StepPlan
from service.generation.sequence import Sequence
from service.manifest import GenerationLayout

LayerCache = tuple[np.ndarray, np.ndarray]  # keys, values: [batch, heads, positions, head_dim]


@dataclass(frozen=True)
class StepResult:
    tokens: dict[int, int]  # sequence id -> next token
    prefill_s: float
    decode_s: float


@dataclass
class DecodeBatch:
    """The running batch as the graph sees it: which sequence each row is, and the cache it carries.

    The cache's first `width` columns are in use; an appending graph's cache has room after them for the
    next positions (masked out and zero until written)."""

    ids: list[int]
    past: list[LayerCache]  # per layer
    mask: np.ndarray  # [batch, capacity] int64: 1 where a row holds one of its own tokens
    cached: np.ndarray  # [batch] int64: tokens each row holds, its next token's position id
    width: int

    def append(self, new: list[LayerCache]) -> None:
        """Write each row's one new position into the next free column, making room first if none."""
        if self.width == self.mask.shape[1]:
            self._widen(ROOM)
        column = self.width
        for layer, new_layer in zip(self.past, new, strict=True):
            for tensor, new_tensor in zip(layer, new_layer, strict=True):
                tensor[:, :, column] = new_tensor[:, :, -1]
        self.mask[:, column] = 1
        self.cached += 1
        self.width += 1

    def _widen(self, room: int) -> None:
        """Copy the cache into one `room` columns wider (once per `room` steps, not once per step)."""
        rows, heads, width, head_dim = self.past[0][0].shape
        wider = []
        for layer in self.past:
            pair = []
            for tensor in layer:
                grown = np.empty((rows, heads, width + room, head_dim), dtype=tensor.dtype)
                grown[:, :, :width] = tensor
                grown[:, :, width:] = 0.0
                pair.append(grown)
            wider.append((pair[0], pair[1]))
        self.past = wider
        self.mask = np.concatenate([self.mask, np.zeros((rows, room), dtype=self.mask.dtype)], axis=1)


class DecoderRunner:
    def __init__(self, engine: Engine, layout: GenerationLayout) -> None:
        self.engine = engine
        self.layout = layout
        self._past_names = [
            (layout.past_key_name.format(layer=i), layout.past_value_name.format(layer=i))
            for i in range(layout.num_layers)
        ]
        self._present_names = [
            (layout.present_key_name.format(layer=i), layout.present_value_name.format(layer=i))
            for i in range(layout.num_layers)
        ]
        self._appends = layout.present_positions == "new"
        self._batch: DecodeBatch | None = None
        self._prefilled: dict[int, list[LayerCache]] = {}  # caches of sequences about to join the batch

    def execute(self, plan: StepPlan) -> StepResult:
        tokens: dict[int, int] = {}
        started = time.perf_counter()
        if plan.prefill:
            tokens |= self._prefill(plan.prefill)
        prefilled = time.perf_counter()
        if plan.decode:
            tokens |= self._decode(plan.decode)
        else:
            self._batch = None  # nothing runs on: its cache is nobody's
        # A prefilled sequence joins the very next decode; one that did not (finished, aborted) never will.
        fresh = {s.id for s in plan.prefill}
        self._prefilled = {i: c for i, c in self._prefilled.items() if i in fresh}
        return StepResult(tokens, prefilled - started, time.perf_counter() - prefilled)

    def _run(
        self, input_ids: np.ndarray, mask: np.ndarray, positions: np.ndarray, past: list[LayerCache]
    ) -> dict:
        feeds = {"input_ids": input_ids, "attention_mask": mask, "position_ids": positions}
        for (key_name, value_name), (keys, values) in zip(self._past_names, past, strict=True):
            feeds[key_name], feeds[value_name] = keys, values
        return self.engine.run(feeds)

    def _presents(self, outputs: dict) -> list[LayerCache]:
        return [(outputs[key_name], outputs[value_name]) for key_name, value_name in self._present_names]

    def _prefill(self, seqs: Seq[Sequence]) -> dict[int, int]:
        """All new prompts in one call: right-padded, with an empty past."""
        layout = self.layout
        width = max(len(s.prompt) for s in seqs)
        ids = np.zeros((len(seqs), width), dtype=np.int64)
        mask = np.zeros((len(seqs), width), dtype=np.int64)
        for row, s in enumerate(seqs):
            ids[row, : len(s.prompt)] = s.prompt
            mask[row, : len(s.prompt)] = 1
        positions = np.clip(np.cumsum(mask, axis=1) - 1, 0, None)
        empty = np.zeros((len(seqs), layout.num_heads, 0, layout.head_dim), dtype=np.float32)
        outputs = self._run(ids, mask, positions, [(empty, empty)] * layout.num_layers)
        presents = self._presents(outputs)
        tokens = {}
        for row, s in enumerate(seqs):
            n = len(s.prompt)
            self._prefilled[s.id] = [(keys[row, :, :n], values[row, :, :n]) for keys, values in presents]
            tokens[s.id] = next_token(outputs["logits"][row, n - 1], s.params, s.prompt, s.rng)
        return tokens

    def _decode(self, seqs: Seq[Sequence]) -> dict[int, int]:
        """One token for each running sequence: its last token in, the batch's cache as the past."""
        batch = self._batch
        if batch is None or batch.ids != [s.id for s in seqs]:
            batch = self._rebuild(seqs)
        mask = np.concatenate([batch.mask, np.ones((len(seqs), 1), dtype=np.int64)], axis=1)
        ids = np.array([[s.output[-1]] for s in seqs], dtype=np.int64)
        outputs = self._run(ids, mask, batch.cached[:, None], batch.past)
        if self._appends:  # the graph returned the new position only: into the batch's own cache
            batch.append(self._presents(outputs))
            self._batch = batch
        else:  # the graph returned past + new: that is the next step's past
            presents = self._presents(outputs)
            self._batch = DecodeBatch(batch.ids, presents, mask, batch.cached + 1, mask.shape[1])
        return dict(zip((s.id for s in seqs), _next_tokens(outputs["logits"][:, -1], seqs), strict=True))

    def _rebuild(self, seqs: Seq[Sequence]) -> DecodeBatch:
        """The batch for `seqs`: rows that ran last step keep their cache, new ones bring their own."""
        old = self._batch
        old_rows = {seq_id: row for row, seq_id in enumerate(old.ids)} if old is not None else {}
        fresh: list[tuple[int, list[LayerCache]]] = []  # (row, prefill cache)
        stay: list[tuple[int, int]] = []  # (row, row in the old batch)
        for row, s in enumerate(seqs):
            if s.id in self._prefilled:
                fresh.append((row, self._prefilled.pop(s.id)))
            elif s.id in old_rows:
                stay.append((row, old_rows[s.id]))
            else:
                raise RuntimeError(f"sequence {s.id} is decoding without a prefilled cache")
        kept_rows = _rows(np.array([o for _, o in stay], dtype=np.intp))
        columns, kept_width = (
            _kept_columns(old.mask[kept_rows][:, : old.width], SLACK)
            if old is not None and stay
            else (slice(0), 0)
        )
        width = max([kept_width] + [cache[0][0].shape[1] for _, cache in fresh])
        capacity = width + (ROOM if self._appends else 0)
        layout = self.layout
        shape = (len(seqs), layout.num_heads, capacity, layout.head_dim)
        # Every element is written once below: the rows' caches, then zeros after each row's end (masked
        # out, but must be finite: a NaN left in memory would survive the attention's zero weight).
        past = [
            (np.empty(shape, dtype=np.float32), np.empty(shape, dtype=np.float32)) for _ in self._past_names
        ]
        mask = np.zeros((len(seqs), capacity), dtype=np.int64)
        cached = np.zeros(len(seqs), dtype=np.int64)
        if old is not None and stay:
            rows = _rows(np.array([r for r, _ in stay], dtype=np.intp))
            mask[rows, :kept_width] = old.mask[kept_rows][:, : old.width][:, columns]
            cached[rows] = old.cached[kept_rows]
            for layer, old_layer in zip(past, old.past, strict=True):
                for tensor, old_tensor in zip(layer, old_layer, strict=True):
                    tensor[rows, :, :kept_width] = old_tensor[kept_rows][:, :, : old.width][:, :, columns]
                    tensor[rows, :, kept_width:] = 0.0
        for row, cache in fresh:
            n = cache[0][0].shape[1]
            mask[row, :n], cached[row] = 1, n
            for layer, row_layer in zip(past, cache, strict=True):
                for tensor, row_tensor in zip(layer, row_layer, strict=True):
                    tensor[row, :, :n] = row_tensor
                    tensor[row, :, n:] = 0.0
        return DecodeBatch([s.id for s in seqs], past, mask, cached, width)


# The share of the cache's width that may be columns no row uses before a rebuild drops them: every step's
# graph copies the whole cache (past + new position), so width costs every step while a drop costs once.
# Engine alone, a join every other step, 3 rounds each: 0.05 -> 3,837 / 3,657 / 3,878 tokens/s, 0.25 ->
# 3,692 / 3,405 / 3,562, 0.5 -> 3,428 / 2,548 / 3,110 (0 and 0.12 within the noise of 0.05).
SLACK = 0.05

# Columns an appending graph's cache is given beyond what it holds, so that the cache is copied into a
# wider one once every ROOM steps rather than every step; the room is masked, and attention reads it.
ROOM = 16


def _rows(index: np.ndarray) -> slice | np.ndarray:
    """A run of consecutive rows as a slice (numpy then copies through a view, not a gathered temporary)."""
    if len(index) and index[-1] - index[0] == len(index) - 1:
        return slice(int(index[0]), int(index[-1]) + 1)
    return index


def _kept_columns(mask: np.ndarray, slack: float) -> tuple[slice | np.ndarray, int]:
    """The cache columns the staying rows keep, and how many: all of them (gaps included, the mask hides
    them) until more than `slack` of the width is used by none of them (what only leavers held); then
    only the used ones. Dropping at every leave cost a gathered copy of the whole cache per tensor."""
    width = mask.shape[1]
    used = np.flatnonzero(mask.any(axis=0))
    if width - len(used) <= slack * width:
        return slice(None), width
    return used, len(used)


def _next_tokens(logits: np.ndarray, seqs: Seq[Sequence]) -> list[int]:
    """One token per row of `logits` [batch, vocab]: the plain greedy rows (no repetition penalty, most of
    them) from one argmax over the batch, the others through the sampler one by one."""
    best = logits.argmax(axis=-1)
    return [
        int(best[row])
        if s.params.greedy and s.params.repetition_penalty == 1.0
        else next_token(logits[row], s.params, s.prompt + s.output, s.rng)
        for row, s in enumerate(seqs)
    ]
