"""The runner executes a step plan on the exported decoder: batched prefill, batched decode (the tokens and
log-probabilities chosen from their logits: choices.py; prompts that begin alike: prefix_cache.py).

Sequences of different lengths share one engine call. Prompts are right-padded into one prefill (in chunks of
columns where they hold more than `prefill_tokens` positions, one chunk a step while others decode:
`_prefill`). The running sequences' keys and values live in a `SlotCache` (slot_cache.py): one row per
sequence, its positions left-aligned in columns [0, length), the next one written into column `length`, and
the attention mask hides the rest; each sequence keeps its own
position ids, so it computes the same logits alone or in company.

The graph gets the cache's first rows as they lie (a view, no copy) and returns the new position; with
distilserve's appending graph (GPT-2) that is all it returns, with optimum's it is the last column of a
past + new it copied whole. A sequence that joins has its prefill written into the next free row; one that
leaves has the last row moved into its place: a join or a leave copies one row, not the batch. Rebuilding
the batch's cache at each join or leave was a third of the engine thread's time with staggered arrivals,
and every step's copy of the whole cache (optimum's graph) half of a batch-16 decode step.

On a GPU (an engine that binds its inputs and outputs) optimum's graph keeps the cache on the device
instead: `DeviceCache` (device_cache.py) binds each step's presents as the next step's past and re-forms its
rows there when sequences join or leave, so a step copies no cache between host and device. distilserve's
appending graph keeps the host cache there too.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from collections.abc import Sequence as Seq
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from common.draft_head import CONTEXT_INPUT, DraftHead
from common.logit_positions import LOGIT_POSITIONS, ending_positions, every_position, last_position
from service.engine import DeviceEngine, Engine
from service.generation.choices import StepLogprobs, add_logprobs, next_tokens, prefill_choices
from service.generation.device_cache import DeviceCache, RowGather
from service.generation.prefix_cache import PrefixCache
from service.generation.prompt_batch import PromptBatch
from service.generation.scheduler import PREFILL_TOKENS, StepPlan
from service.generation.sequence import Sequence
from service.generation.slot_cache import LayerCache, SlotCache
from service.manifest import GenerationLayout


@dataclass(frozen=True)
class StepResult:
    tokens: dict[int, int]  # sequence id -> next token
    prefill_s: float
    decode_s: float
    more: dict[int, list[int]] = field(default_factory=dict)  # tokens after it (speculative decoding)
    drafted: int = 0  # speculative decoding: draft tokens proposed this step
    accepted: int = 0  # of them, kept by the teacher
    checked: int = 0  # sequences whose drafts the teacher's pass checked (one teacher step each)
    logprobs: StepLogprobs = field(default_factory=lambda: StepLogprobs())
    prompt_tokens: int = 0  # prompt tokens whose prefill began this step
    cached_tokens: int = 0  # of them, read from the prefix cache instead of run
    prefix_cache_bytes: int = 0  # what the prefix caches hold after the step (a draft's included)


# A step's first tokens handed out before its decode call (`DecoderRunner.execute`): sequence id -> token,
# and the step's log-probabilities so far.
FirstTokens = Callable[[dict[int, int], "StepLogprobs"], None]


class DecoderRunner:
    def __init__(
        self,
        engine: Engine,
        layout: GenerationLayout,
        prefill_tokens: int = PREFILL_TOKENS,
        head: DraftHead | None = None,
        prefix_cache_bytes: int = 0,
    ) -> None:
        """`head`: a draft graph's cut head (common/draft_head.py): each call scores the ids below its
        `tokens` and those in `context`, which the speculative runner sets before drafting (empty, the
        cheapest, for prefills, whose logits a draft does not use). `prefix_cache_bytes`: the budget of
        prompts' first blocks kept for later prompts that begin alike (prefix_cache.py; 0: none), on a
        graph that returns only the new positions (the host cache's)."""
        self.engine = engine
        self.layout = layout
        self.prefill_tokens = prefill_tokens
        self.head = head
        self.context = np.zeros(0, dtype=np.int64)
        self.picks_logits = LOGIT_POSITIONS in engine.input_names  # common/logit_positions.py
        self._past_names = [
            (layout.past_key_name.format(layer=i), layout.past_value_name.format(layer=i))
            for i in range(layout.num_layers)
        ]
        self._present_names = [
            (layout.present_key_name.format(layer=i), layout.present_value_name.format(layer=i))
            for i in range(layout.num_layers)
        ]
        self._cache: SlotCache | DeviceCache | None = None
        self._prefilled: dict[int, list[LayerCache]] = {}  # caches of sequences about to join the batch
        self._prompts: PromptBatch | None = None  # prompts part-way through their prefill
        # The cache stays on the device where the engine binds IO and the graph returns past + new.
        self._device = cache_device(engine, layout)
        self._keep = frozenset(name for pair in self._present_names for name in pair)
        self.row_gather = RowGather(self._device) if self._device is not None else None  # joins, leaves
        appends = layout.present_positions == "new"
        self.prefixes = PrefixCache(prefix_cache_bytes) if prefix_cache_bytes and appends else None
        self._counted = [0, 0]  # prompt tokens whose prefill began, of them cached, since last taken
        self._rows: dict[int, Sequence] = {}  # the sequences in its decode cache (prefix cache: their tokens)

    def execute(self, plan: StepPlan, first_tokens: FirstTokens | None = None) -> StepResult:
        """The step: the prompts' prefill (one chunk of it while sequences decode, so they wait for a chunk,
        not a whole long prompt; all of it otherwise), then one decode step of the running sequences. A
        prompt's first token comes in the step its last chunk runs: handed to `first_tokens` before the
        decode call (a newcomer's first token does not wait for the running batch's step), and in the
        result too."""
        tokens: dict[int, int] = {}
        logprobs = StepLogprobs()
        started = time.perf_counter()
        self.retire(self._cache, plan.decode)
        tokens |= self._prefill(plan.prefill, logprobs=logprobs, whole=not plan.decode)
        hand_out(first_tokens, tokens, logprobs, plan)
        prefilled = time.perf_counter()
        if plan.decode:
            tokens |= self._decode(plan.decode, logprobs)
        else:
            self._cache = None  # nothing runs on (its rows retired above): its cache is nobody's
        self.keep_prefilled({s.id for s in plan.prefill})
        prompt, cached = self.take_prompt_counts()
        return StepResult(
            tokens,
            prefilled - started,
            time.perf_counter() - prefilled,
            logprobs=logprobs,
            prompt_tokens=prompt,
            cached_tokens=cached,
            prefix_cache_bytes=self.prefix_cache_bytes,
        )

    def _run(
        self,
        input_ids: np.ndarray,
        mask: np.ndarray,
        positions: np.ndarray,
        past: list[tuple[Any, Any]],
        on_device: bool = False,
        logit_positions: np.ndarray | None = None,
    ) -> dict[str, Any]:
        """Past as host arrays, or `on_device` as a device cache's OrtValues: the presents stay there.
        `logit_positions` [rows, n]: the positions whose logits are wanted, where the graph can pick them
        (None: every position's)."""
        feeds: dict[str, Any] = {"input_ids": input_ids, "attention_mask": mask, "position_ids": positions}
        if self.picks_logits:
            feeds[LOGIT_POSITIONS] = (
                every_position(*input_ids.shape) if logit_positions is None else logit_positions
            )
        for (key_name, value_name), (keys, values) in zip(self._past_names, past, strict=True):
            feeds[key_name], feeds[value_name] = keys, values
        if self.head is not None:
            feeds[CONTEXT_INPUT] = self.context
        if on_device and self._device is not None:
            return self._device.run_bound(feeds, keep=self._keep)
        return self.engine.run(feeds)

    def _presents(self, outputs: dict[str, Any]) -> list[tuple[Any, Any]]:
        return [(outputs[key_name], outputs[value_name]) for key_name, value_name in self._present_names]

    def prefill(
        self,
        seqs: Seq[Sequence],
        choose: bool = True,
        logprobs: StepLogprobs | None = None,
        whole: bool = True,
    ) -> dict[int, int]:
        """A step's prompts (`StepPlan.prefill`): their caches, kept until the sequences join the decode
        batch, and (`choose`) each one's first token, its log-probabilities into `logprobs` where asked; a
        draft model prefills without choosing (its choice would spend the sequence's RNG). Not `whole`: the
        prompts under way go on by their next chunk only (see `_prefill`)."""
        return self._prefill(seqs, choose, logprobs, whole)

    def prefill_aside(self, seqs: Seq[Sequence]) -> None:
        """Contexts prefilled whole, without choosing, beside whatever prompts are under way (a draft
        catching up on sequences already running): their caches join the decode batch at the next step."""
        self._run_prompts(self._batch(seqs, answering=False), False, None, whole=True)

    def _batch(self, seqs: Seq[Sequence], answering: bool) -> PromptBatch:
        """New prompts as a batch, their cached blocks found; counted, and each sequence's cached tokens
        noted, where this model answers them (a draft's prefill is neither)."""
        batch = PromptBatch.of(seqs, self.layout, self.prefixes)
        if answering:
            self._counted[0] += sum(len(s.prompt) for s in seqs)
            self._counted[1] += int(batch.cached.sum())
            for s, cached in zip(batch.seqs, batch.cached, strict=True):
                s.cached_tokens = int(cached)
        return batch

    def cached_length(self, prompt: list[int]) -> int:
        """How many of `prompt`'s first tokens its prefill would read from the prefix cache (0: no cache)."""
        return self.prefixes.cached_length(prompt) if self.prefixes is not None else 0

    @property
    def prefix_cache_bytes(self) -> int:
        return self.prefixes.bytes if self.prefixes is not None else 0

    def take_prompt_counts(self) -> tuple[int, int]:
        """(prompt tokens whose prefill began, of them read from the prefix cache) since the last call."""
        counted, self._counted = self._counted, [0, 0]
        return counted[0], counted[1]

    @property
    def prefilling(self) -> bool:
        """Whether prompts are part-way through their prefill (chunked, a chunk a step)."""
        return self._prompts is not None

    def prefilled_ids(self) -> set[int]:
        """The sequences whose prefilled caches wait to join the decode batch."""
        return set(self._prefilled)

    def keep_prefilled(self, fresh: set[int]) -> None:
        """A prefilled sequence joins the very next decode; one that did not (finished, aborted) never will:
        its prefilled cache goes."""
        self._prefilled = {i: c for i, c in self._prefilled.items() if i in fresh}

    def run_step(
        self,
        input_ids: np.ndarray,
        mask: np.ndarray,
        positions: np.ndarray,
        past: list[LayerCache],
        last_only: bool = False,
    ) -> dict[str, Any]:
        """One engine call on host arrays: several new positions per row are allowed (after a past), every
        one's logits, or (`last_only`) the last column's alone where the graph can pick them."""
        last = last_position(*input_ids.shape) if last_only else None
        return self._run(input_ids, mask, positions, past, logit_positions=last)

    def presents(self, outputs: dict[str, Any]) -> list[tuple[Any, Any]]:
        return self._presents(outputs)

    def _prefill(
        self,
        seqs: Seq[Sequence],
        choose: bool = True,
        logprobs: StepLogprobs | None = None,
        whole: bool = True,
    ) -> dict[int, int]:
        """The step's prompts: those under way (a `PromptBatch` begun at an earlier step, less those done)
        go on by their next chunk, or all of them (`whole`); new ones beside them are prefilled whole (the
        scheduler admits beside a batch under way only prompts that fit one call: a short request does not
        wait behind a long one); new ones alone start a batch of their own, chunked the same way."""
        under_way = self._prompts
        going_on = [s for s in seqs if under_way is not None and under_way.has(s)]
        new = [s for s in seqs if not (under_way is not None and under_way.has(s))]
        tokens: dict[int, int] = {}
        self._prompts = None
        if going_on:
            assert under_way is not None
            under_way.keep(going_on)
            tokens |= self._run_prompts(under_way, choose, logprobs, whole)
            if new:
                tokens |= self._run_prompts(self._batch(new, choose), choose, logprobs, whole=True)
            self._prompts = None if under_way.done else under_way
        elif new:
            batch = self._batch(new, choose)
            tokens |= self._run_prompts(batch, choose, logprobs, whole)
            self._prompts = None if batch.done else batch
        return tokens

    def _run_prompts(
        self, batch: PromptBatch, choose: bool, logprobs: StepLogprobs | None, whole: bool
    ) -> dict[int, int]:
        """Right-padded prompts in chunks of columns that keep a call to `prefill_tokens` positions (rows x
        columns), each chunk's presents the next one's past: all chunks, or (not `whole`) the next one. A
        prompt that ends in a chunk is done there: its first token chosen (`choose`), its cache kept to join
        the decode batch.

        Where the graph picks positions (common/logit_positions.py) a chunk's logits are each row's last
        position's, [rows, 1, vocab]; otherwise (optimum's graph, or prompt log-probabilities asked) they
        are [rows, columns, vocab]: four 2,048-token prompts of a 49,152-token vocabulary in one call are
        1.6 GB of logits alone, and ONNX Runtime's arena keeps the largest call's memory for good. And a
        step's chunk is what the running sequences wait for, a token each, while it runs."""
        tokens: dict[int, int] = {}
        rows = len(batch.seqs)
        lengths = batch.lengths
        gathered = batch.prompt_logprobs if logprobs is not None else None
        # the graph scores each row's last position in the chunk alone unless prompt log-probabilities
        # need every one (a draft's prefill, which chooses nothing, uses none: the same single column)
        ending = self.picks_logits and not any(s.params.prompt_logprobs is not None for s in batch.seqs)
        while not batch.done:
            start, end = batch.start, min(batch.width, batch.start + max(1, self.prefill_tokens // rows))
            outputs = self._run(
                batch.ids[:, start:end],
                batch.mask_to(end),
                batch.positions[:, start:end],
                batch.past,
                logit_positions=ending_positions(lengths, start, end) if ending else None,
            )
            presents = self._presents(outputs)
            if self.layout.present_positions == "new":  # the appending graph returns the chunk's alone
                presents = [
                    (np.concatenate([pk, k], axis=2), np.concatenate([pv, v], axis=2))
                    for (pk, pv), (k, v) in zip(batch.past, presents, strict=True)
                ]
            batch.past, batch.start = presents, end
            if choose:
                tokens |= prefill_choices(
                    batch.seqs, outputs["logits"], start, end, lengths, logprobs, gathered, ending
                )
            for row, s in enumerate(batch.seqs):
                if start <= lengths[row] - 1 < end:  # its prompt ends here: its cache joins the decode batch
                    self._prefilled[s.id] = batch.row_cache(presents, row, end)
                    if self.prefixes is not None:
                        self.prefixes.add(s.prompt, self._prefilled[s.id])
            if not whole:
                break
        return tokens

    def _decode(self, seqs: Seq[Sequence], logprobs: StepLogprobs) -> dict[int, int]:
        """One token for each running sequence: its last token in, its row of the cache as the past."""
        cache = self._cache or self._new_cache()
        rows = sync_rows(cache, seqs, self)
        self._cache = cache
        past, mask, positions = cache.feeds()
        ids = np.array([[s.output[-1]] for s in rows], dtype=np.int64)
        outputs = self._run(ids, mask, positions, past, on_device=isinstance(cache, DeviceCache))
        cache.append(self._presents(outputs))
        chosen = next_tokens(outputs["logits"][:, -1], rows)
        for row, (s, token) in enumerate(zip(rows, chosen, strict=True)):
            add_logprobs(logprobs.tokens, s, outputs["logits"][row, -1:], [token])
        return dict(zip(cache.ids, chosen, strict=True))

    def joined(self, seq: Sequence) -> None:
        """`seq` took a row of the decode cache."""
        if self.prefixes is not None:
            self._rows[seq.id] = seq

    def leaving(self, seq_id: int, cache: SlotCache | DeviceCache) -> None:
        """A sequence about to leave the decode cache leaves its whole blocks (prompt and output) in the
        prefix cache: a chat's next turn, its earlier answer and all, begins with them."""
        seq = self._rows.pop(seq_id, None)
        if seq is None or self.prefixes is None or not isinstance(cache, SlotCache):
            return
        layers = cache.row(seq_id)
        tokens = [*seq.prompt, *seq.output]
        fed = min(layers[0][0].shape[1], len(tokens))  # a finished round may hold drafts past its end
        self.prefixes.add(tokens[:fed], layers)

    def retire(self, cache: SlotCache | DeviceCache | None, running: Seq[Sequence]) -> None:
        """Rows of sequences no longer `running` leave `cache` (this runner's) before the step's prefill, so
        that the prompts it runs find their blocks (a chat's next turn quotes the answer just finished)."""
        if cache is not None:
            still = {s.id for s in running}
            for seq_id in [i for i in cache.ids if i not in still]:
                self.leaving(seq_id, cache)
                cache.leave(seq_id)

    def release(self, cache: SlotCache | DeviceCache | None) -> None:
        """A decode cache dropped while its rows still run (a draft left out of a crowded step): each row's
        blocks so far into the prefix cache, as if it left."""
        if cache is not None:
            for seq_id in list(cache.ids):
                self.leaving(seq_id, cache)

    def _new_cache(self) -> SlotCache | DeviceCache:
        layout = self.layout
        if self.row_gather is not None:
            return DeviceCache(layout.num_key_value_heads, layout.head_dim, self.row_gather)
        return SlotCache(layout.num_layers, layout.num_key_value_heads, layout.head_dim)


def sync_rows(cache: SlotCache | DeviceCache, seqs: Seq[Sequence], runner: DecoderRunner) -> list[Sequence]:
    """The cache's rows made the running sequences': finished ones leave, prefilled ones join (from
    `runner`'s prefill); the sequences in row order."""
    if [s.id for s in seqs] == cache.ids:  # the same rows as last step (most steps)
        return list(seqs)
    by_id = {s.id: s for s in seqs}
    for seq_id in [i for i in cache.ids if i not in by_id]:
        runner.leaving(seq_id, cache)
        cache.leave(seq_id)
    running = set(cache.ids)
    for s in seqs:
        if s.id in runner._prefilled:
            cache.join(s.id, runner._prefilled.pop(s.id))
            runner.joined(s)
        elif s.id not in running:
            raise RuntimeError(f"sequence {s.id} is decoding without a prefilled cache")
    return [by_id[i] for i in cache.ids]


def hand_out(
    first_tokens: FirstTokens | None, tokens: dict[int, int], logprobs: StepLogprobs, plan: StepPlan
) -> None:
    """The prompts' first tokens to `first_tokens`, where there are some and a decode call is still to come
    this step (without one the step ends now: the result carries them as soon)."""
    if first_tokens is not None and tokens and plan.decode:
        first_tokens(tokens, logprobs)


def cache_device(engine: Engine, layout: GenerationLayout) -> DeviceEngine | None:
    """The engine whose device keeps the KV cache between decode steps, if any: one that binds IO (on
    CUDA, or forced) running a graph whose presents are past + new, the next step's past as they are."""
    if isinstance(engine, DeviceEngine) and engine.binds_io and layout.present_positions == "all":
        return engine
    return None
