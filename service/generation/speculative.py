"""Speculative decoding: a teacher's generation drafted by its own distilled student.

Each decode step of the running batch, the student (the draft) proposes k tokens per sequence, one cheap
step at a time, and the teacher checks all k in one forward pass over them with its KV cache (the appending
graph takes several new positions after a past, causally). The longest prefix the teacher agrees with is
kept, plus one token of the teacher's own: every step yields 1 to k + 1 tokens for one teacher pass. With a
`confidence`, a round ends early once the draft is unsure of its last token (it is still checked).

- Greedy: a draft token is kept while it is the teacher's argmax after the tokens before it, so the text is
  the teacher's greedy text exactly.
- Sampling: the accept/reject rule of Leviathan et al. (2023) and Chen et al. (2023), so each emitted token
  is distributed exactly as the teacher's sampler would have drawn it (service.generation.acceptance).

Both models keep their caches in `SlotCache`s of the same rows. After a step the teacher's cache holds the
kept positions (the rejected ones are cut off: `SlotCache.truncate`), and so does the draft's, but for the
k-th draft of a row that kept all k: no pass fed it (a pass only to cache it would make a round k + 1 draft
passes). The next round's first draft pass then takes two tokens for every row, that one (or, for the other
rows, the token before the teacher's new one, fed again) and the teacher's new token; otherwise one. A prompt
prefilled whole is the teacher's alone, so its first token does not wait for the draft's prefill: the next
step prefills the draft with what it lacks before drafting (`_caught_up`). Chunked prompts go in lockstep.

The draft follows its student's versions while the teacher serves (`replace_draft`, service.model_control):
a new one is taken at the next step, the running sequences' contexts prefilled into it then; with none (the
student unloaded) the teacher decodes alone, one token a step, from the cache it already holds.
"""

from __future__ import annotations

import dataclasses
import logging
import threading
import time
from collections.abc import Sequence as Seq
from typing import Any

import numpy as np

from service.engine import Engine
from service.generation.acceptance import accept, allowed_ahead, distribution, draw
from service.generation.choices import StepLogprobs, add_logprobs
from service.generation.runner import DecoderRunner, FirstTokens, StepResult, hand_out, sync_rows
from service.generation.scheduler import StepPlan
from service.generation.sequence import Sequence
from service.generation.slot_cache import SlotCache
from service.manifest import GenerationLayout, Manifest

log = logging.getLogger(__name__)

DRAFT_COST_LIMIT = 1 / 3  # auto: a draft step must cost at most this share of a teacher step


class SpeculativeRunner:
    """The teacher's runner with a draft: prefill runs both; decode drafts k tokens and checks them."""

    def __init__(
        self,
        teacher: DecoderRunner,
        draft: DecoderRunner | None,
        k: int,
        window: int,
        max_batch: int = 0,
        confidence: float = 0.0,
    ) -> None:
        """`max_batch`: draft only while at most this many sequences decode (0: always). A CPU's teacher
        checks k + 1 positions of many rows at nearly k + 1 times a step's cost: drafting that pays at one
        stream loses at sixteen. Above it the teacher decodes alone (`_crowded`).
        `confidence`: a round ends before its k-th draft once no row's last draft had at least this
        probability under the draft (0: always k). Checking more positions costs the teacher little; each
        draft pass costs the draft one: drafting on only while the draft is sure spends passes where they
        are kept (`_sure`)."""
        self.teacher, self.draft, self.k, self.window = teacher, draft, k, window
        self.max_batch, self.confidence = max_batch, confidence
        self._caches: tuple[SlotCache, SlotCache | None] | None = None
        self._next_draft: tuple[DecoderRunner | None] | None = None  # handed over, taken at the next step
        self._handover = threading.Lock()  # replace_draft's thread against the engine thread taking it

    @property
    def layout(self) -> GenerationLayout:
        """The teacher's: what the engine reads of a runner."""
        return self.teacher.layout

    @property
    def drafting_with(self) -> DecoderRunner | None:
        """The draft from the next step on (one handed over and not yet taken included)."""
        return self._next_draft[0] if self._next_draft is not None else self.draft

    def replace_draft(self, draft: DecoderRunner | None) -> None:
        """Draft with `draft` (None: none) from the next step on; any thread may call it (the engine thread
        takes it between steps, never under a running one)."""
        with self._handover:
            self._next_draft = (draft,)

    def _take_draft(self) -> None:
        if self._next_draft is None:  # most steps: nothing handed over (read without the lock)
            return
        with self._handover:
            handed, self._next_draft = self._next_draft, None
        if handed is None:
            return
        self.draft = handed[0]
        if self._caches is not None:  # the running rows get the new draft's cache in _step (catch-up)
            self._caches = (self._caches[0], None)

    def _draft_cache(self) -> SlotCache | None:
        if self.draft is None:
            return None
        layout = self.draft.layout
        return SlotCache(layout.num_layers, layout.num_key_value_heads, layout.head_dim)

    def execute(self, plan: StepPlan, first_tokens: FirstTokens | None = None) -> StepResult:
        """The teacher's prefill (the draft's too where prompts go in chunks), its first tokens handed to
        `first_tokens` before the round of drafting and checking the running sequences (as
        `DecoderRunner.execute`)."""
        self._take_draft()
        started = time.perf_counter()
        tokens: dict[int, int] = {}
        more: dict[int, list[int]] = {}
        logprobs = StepLogprobs()
        drafted = accepted = checked = 0
        if self._caches is not None:  # finished rows leave first: their blocks for this step's prompts
            self.teacher.retire(self._caches[0], plan.decode)
            if self.draft is not None:
                self.draft.retire(self._caches[1], plan.decode)
        whole = not plan.decode  # a chunk a step while sequences decode, the same chunks for both models
        tokens |= self.teacher.prefill(plan.prefill, logprobs=logprobs, whole=whole)
        hand_out(first_tokens, tokens, logprobs, plan)
        draft = None if self._crowded(len(plan.decode) + len(plan.prefill)) else self.draft
        if draft is not None and (self.teacher.prefilling or draft.prefilling):
            draft.prefill(plan.prefill, choose=False, whole=whole)  # chunked prompts: in lockstep
        # else prompts prefilled whole: their first tokens go out without waiting for the draft's prefill,
        # which the next step's catch-up does (`_caught_up`), and none for a sequence that never decodes
        prefilled = time.perf_counter()
        if plan.decode:
            emitted_by, k = self._step(plan.decode, logprobs)
            for seq_id, emitted in emitted_by.items():
                tokens[seq_id], more[seq_id] = emitted[0], emitted[1:]
                drafted, accepted = drafted + k, accepted + len(emitted) - 1
            checked = len(plan.decode) if k else 0  # a step that drafted nothing is a plain decode step
        else:
            self._caches = None  # nothing runs on (its rows retired above)
        fresh = {s.id for s in plan.prefill}
        self.teacher.keep_prefilled(fresh)
        if self.draft is not None:
            self.draft.keep_prefilled(fresh)
        decode_s = time.perf_counter() - prefilled
        prompt, cached = self.teacher.take_prompt_counts()
        held = self.teacher.prefix_cache_bytes + (self.draft.prefix_cache_bytes if self.draft else 0)
        return StepResult(
            tokens,
            prefilled - started,
            decode_s,
            more,
            drafted,
            accepted,
            checked,
            logprobs,
            prompt,
            cached,
            held,
        )

    def _step(self, seqs: Seq[Sequence], logprobs: StepLogprobs) -> tuple[dict[int, list[int]], int]:
        """Each sequence's emitted tokens, and the number drafted for each; the teacher's log-probabilities
        of them into `logprobs` where asked (each from the teacher's pass at the position that chose it)."""
        if self._caches is None:
            layout = self.teacher.layout
            teacher_cache = SlotCache(layout.num_layers, layout.num_key_value_heads, layout.head_dim)
            self._caches = (teacher_cache, self._draft_cache())
        teacher_cache, draft_cache = self._caches
        rows = sync_rows(teacher_cache, seqs, self.teacher)
        if self.draft is None or self._crowded(len(rows)):
            if self.draft is not None:
                self.draft.release(draft_cache)
            draft_cache = None  # the teacher decodes alone; a draft catches up once the crowd thins
        elif draft_cache is None or not self._draft_holds(draft_cache, rows):
            # a draft taken, or left out while crowded, while these rows ran, or rows whose prompts it did not
            # prefill (nothing decoded then, or it missed a chunk): their contexts prefilled into it
            draft_cache = self._caught_up(rows, draft_cache)
        self._caches = (teacher_cache, draft_cache)
        if draft_cache is not None:
            assert self.draft is not None
            sync_rows(draft_cache, rows, self.draft)  # the teacher's row order
        n = len(rows)
        start = teacher_cache.lengths[:n].copy()  # positions cached: prompt + output minus the last token
        k = self._draft_length(rows, start) if draft_cache is not None else 0
        last = np.array([s.output[-1] for s in rows], dtype=np.int64)

        drafts = np.zeros((n, k), dtype=np.int64)
        # rows that sample, bias or penalise need whole distributions; plain greedy ones an argmax
        shaped = [row for row, s in enumerate(rows) if not s.params.argmax]
        q: list[list[np.ndarray]] = [[] for _ in rows]
        # constrained rows (grammar, min_tokens): the tokens allowed at each drafted position, and after
        masks: dict[int, list[np.ndarray]] = {row: [] for row, s in enumerate(rows) if s.constrained}
        if draft_cache is not None:
            assert self.draft is not None
            feed = last[:, None]
            if (draft_cache.lengths[:n] < start).any():  # a row kept all its drafts: the k-th is not fed
                draft_cache.truncate(start - 1)  # every row takes two tokens, the one before `last` again
                before_last = [s.output[-2] if len(s.output) > 1 else s.prompt[-1] for s in rows]
                feed = np.stack([np.array(before_last, dtype=np.int64), last], axis=1)
            head = self.draft.head
            cut = None  # a cut head, and the token id each logit column scores (every draft is one of them)
            if head is not None:
                self.draft.context = head.context([*s.prompt, *s.output] for s in rows)
                cut = head, head.columns(self.draft.context)
            for j in range(max(k, 1)):
                out = _feed(self.draft, draft_cache, feed, last_only=True)
                if j == k:  # k = 0: the pass only kept the draft's cache in step
                    break
                logits = out["logits"][:, -1]
                best = logits.argmax(axis=-1)  # plain greedy rows: no distribution needed
                drafts[:, j] = best if cut is None else cut[1][best]
                scores = {
                    row: logits[row] if cut is None else cut[0].whole(logits[row], cut[1]) for row in shaped
                }
                if not self._grammar_allows(rows, masks, scores, j):
                    k, drafts = j, drafts[:, :j]  # a grammar allows nothing the draft can say: the teacher's
                    break
                for row in shaped:
                    s = rows[row]
                    output = [*s.output, *drafts[row, :j].tolist()]
                    allowed = masks[row][j] if row in masks else None
                    dist = distribution(scores[row], s.params, s.prompt, output, allowed)
                    q[row].append(dist)
                    drafts[row, j] = int(np.argmax(dist)) if s.rng is None else draw(dist, s.rng)
                    if s.grammar is not None:
                        s.grammar.try_ahead(int(drafts[row, j]))
                feed = drafts[:, j : j + 1]
                if j + 1 < k and not self._sure(logits, drafts[:, j], q, [r for r in shaped if rows[r].rng]):
                    k, drafts = j + 1, drafts[:, : j + 1]  # the round ends here: the draft is guessing
                    break
            self.draft.context = np.zeros(0, dtype=np.int64)  # prefills score no context (their logits go)

        out = _feed(self.teacher, teacher_cache, np.concatenate([last[:, None], drafts], axis=1))
        for row, row_masks in masks.items():
            s = rows[row]
            if len(row_masks) == k:  # after the last draft (or with none)
                row_masks.append(allowed_ahead(s, out["logits"].shape[-1], k))
            if s.grammar is not None:
                s.grammar.take_back()  # the kept tokens advance it as they are recorded (engine_thread)

        emitted: dict[int, list[int]] = {}
        best = out["logits"].argmax(axis=-1)  # [rows, k + 1]: the teacher's greedy choice at each position
        sampled = set(shaped)
        for row, s in enumerate(rows):
            if row not in sampled:  # the agreeing prefix, then the teacher's own token
                agree = drafts[row] == best[row, :k]
                m = k if agree.all() else int(np.argmin(agree))
                emitted[s.id] = [*drafts[row, :m].tolist(), int(best[row, m])]
                continue
            p = [
                distribution(
                    out["logits"][row, j],
                    s.params,
                    s.prompt,
                    [*s.output, *drafts[row, :j].tolist()],
                    masks[row][j] if row in masks else None,
                )
                for j in range(k + 1)
            ]
            emitted[s.id] = accept(drafts[row].tolist(), q[row], p, s.rng)
        for row, s in enumerate(rows):
            add_logprobs(logprobs.tokens, s, out["logits"][row, : len(emitted[s.id])], emitted[s.id])
        kept_lengths = start + 1 + np.array([len(emitted[s.id]) - 1 for s in rows])
        teacher_cache.truncate(kept_lengths)
        if draft_cache is not None:
            # the kept positions it was fed; where all k drafts were kept, all but the k-th (never fed)
            draft_cache.truncate(np.minimum(kept_lengths, draft_cache.lengths[:n]))
        return emitted, k

    @staticmethod
    def _grammar_allows(
        rows: Seq[Sequence], masks: dict[int, list[np.ndarray]], scores: dict[int, np.ndarray], j: int
    ) -> bool:
        """Each constrained row's allowed tokens at draft position `j` into `masks`; False where one of them
        allows nothing the draft scored (a cut head's columns), which ends the round before `j`."""
        for row, row_masks in masks.items():
            row_masks.append(allowed_ahead(rows[row], len(scores[row]), j))
            if not np.isfinite(scores[row][row_masks[-1]]).any():
                return False
        return True

    def _sure(
        self, logits: np.ndarray, tokens: np.ndarray, q: list[list[np.ndarray]], sampled: list[int]
    ) -> bool:
        """Whether some row's latest draft had at least `confidence` probability under the draft: its
        softmax's top for greedy rows (a penalised one's `q` is all on its argmax: no measure of sureness),
        the drawn token's under the processed distribution for `sampled` rows.
        (The draft's probability predicts the teacher's agreement: SmolLM2's student kept ~0.55 of its
        drafts at a fixed k, and drafting on only while sure keeps more a pass; docs/benchmarks.md.)"""
        if not self.confidence:
            return True
        scores = logits.astype(np.float32)
        top = 1.0 / np.exp(scores - scores.max(axis=-1, keepdims=True)).sum(axis=-1)
        for row in sampled:
            top[row] = q[row][-1][tokens[row]]
        return bool((top >= self.confidence).any())

    def _crowded(self, rows: int) -> bool:
        """More rows than drafting pays for (`max_batch`): the teacher decodes them alone, and the draft
        neither prefills nor keeps a cache (keeping it in step, a pass a step, cost more than it saved:
        SmolLM2 at 4 streams 0.77x the teacher alone, against 0.97x drafting throughout)."""
        return bool(self.max_batch) and rows > self.max_batch

    def _draft_holds(self, cache: SlotCache, rows: Seq[Sequence]) -> bool:
        """Whether the draft has every row's keys and values, cached or prefilled to join."""
        assert self.draft is not None
        joining = self.draft.prefilled_ids()
        held = set(cache.ids)
        return all(s.id in held or s.id in joining for s in rows)

    def _caught_up(self, rows: Seq[Sequence], cache: SlotCache | None) -> SlotCache:
        """The draft's cache (a new one where `cache` is None) holding every running row: the contexts of
        those it lacks (prompt and output but the last token, what the teacher's cache holds) prefilled
        into it, in the teacher's row order."""
        assert self.draft is not None
        cache = cache if cache is not None else self._draft_cache()
        assert cache is not None
        held = set(cache.ids) | self.draft.prefilled_ids()
        missing = [s for s in rows if s.id not in held]
        if missing:  # the same ids, their outputs but the last token taken as prompt
            contexts = [dataclasses.replace(s, prompt=[*s.prompt, *s.output[:-1]]) for s in missing]
            self.draft.prefill_aside(contexts)
        sync_rows(cache, rows, self.draft)
        return cache

    def _draft_length(self, rows: Seq[Sequence], start: np.ndarray) -> int:
        """k, or fewer where a sequence nears the window or its last token: drafts past either are waste
        (and positions past the window do not exist)."""
        window_room = self.window - 1 - int(start.max())  # the last position fed is start + k
        wanted = max(s.params.max_new_tokens - len(s.output) for s in rows) - 1
        return max(0, min(self.k, window_room, wanted))


def _feed(
    runner: DecoderRunner, cache: SlotCache, ids: np.ndarray, last_only: bool = False
) -> dict[str, Any]:
    """`ids` [rows, width] fed after each row's cached positions, the cache extended by them; the logits of
    every position fed, or (`last_only`) of the last where the graph can pick."""
    past, mask, positions = cache.feeds()
    width = ids.shape[1]
    if width > 1:
        mask = np.concatenate([mask[:, :-1], np.ones((len(ids), width), dtype=mask.dtype)], axis=1)
        positions = positions + np.arange(width)
    out = runner.run_step(ids, mask, positions, past, last_only)
    presents = runner.presents(out)
    if width == 1:
        cache.append(presents)
    else:
        cache.extend(presents)
    return out


def pays_off(teacher: Engine, manifest: Manifest, draft: DecoderRunner) -> bool:
    """Whether drafting is worth it: a draft decode step at most DRAFT_COST_LIMIT of a teacher's, both
    timed now (batch 1, after a 16-token prompt, the fastest of 8 steps). The times are logged."""
    from service.generation.tuning import decode_step_s

    layout = manifest.generation
    assert layout is not None
    teacher_s = decode_step_s(teacher, layout, rows=1, prompt_tokens=16)
    draft_s = decode_step_s(draft.engine, draft.layout, rows=1, prompt_tokens=16, head=draft.head)
    ratio = draft_s / teacher_s
    log.info(
        "%s: a draft step %.2f ms, a teacher step %.2f ms (ratio %.2f, limit %.2f): speculative decoding %s",
        manifest.name,
        1000 * draft_s,
        1000 * teacher_s,
        ratio,
        DRAFT_COST_LIMIT,
        "on" if ratio <= DRAFT_COST_LIMIT else "off",
    )
    return ratio <= DRAFT_COST_LIMIT
