"""Speculative decoding: the student drafts, the teacher checks; greedy text is the teacher's own, and the
sampling rule keeps the teacher's distribution."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
import pytest

from service.engine import Engine
from service.generation.runner import PREFILL_TOKENS, DecoderRunner, StepLogprobs, StepResult
from service.generation.sampling import SamplingParams
from service.generation.scheduler import Scheduler, SchedulerConfig, StepPlan
from service.generation.sequence import Sequence
from service.generation.slot_cache import LayerCache
from service.generation.speculative import SpeculativeRunner
from service.manifest import GenerationLayout
from tests.service.generation.conftest import Loaded


def generate(
    runner: DecoderRunner | SpeculativeRunner,
    requests: list[tuple[int, list[int], int]],
    before_step: Callable[[int], None] | None = None,
    results: list[StepResult] | None = None,
    params: list[SamplingParams] | None = None,
    stop_ids: frozenset[int] = frozenset(),
    **shaping: Any,
) -> list[list[int]]:
    """Continuous batching by hand: request i joins at step `arrival`, leaves after its max_new_tokens,
    greedy with the `shaping` given (a bias, penalties), or with its own `params`; `stop_ids` what the engine
    thread would give each sequence (what min_tokens holds back). `before_step(step)` runs before each step;
    `results` receives each step's result."""
    if params is None:
        params = [SamplingParams(max_new_tokens=n, **shaping) for _, _, n in requests]
    seqs = [
        Sequence(prompt=p, params=q, stop_ids=stop_ids) for (_, p, _), q in zip(requests, params, strict=True)
    ]
    running: list[Sequence] = []
    step = 0
    while any(len(s.output) < s.params.max_new_tokens for s in seqs):
        joining = [s for s, (arrival, _, _) in zip(seqs, requests, strict=True) if arrival == step]
        running = [s for s in running if len(s.output) < s.params.max_new_tokens]
        if before_step is not None:
            before_step(step)
        result = runner.execute(StepPlan(prefill=joining, decode=running))
        if results is not None:
            results.append(result)
        for s in [*joining, *running]:
            for token in (result.tokens[s.id], *result.more.get(s.id, ())):
                if len(s.output) < s.params.max_new_tokens:
                    s.output.append(token)
        running += joining
        step += 1
    return [s.output for s in seqs]


REQUESTS = [
    (0, [5, 9, 13, 2], 20),
    (0, [7, 7, 7], 5),
    (1, [100, 20, 30, 40, 50, 60], 30),
    (3, [3], 12),
    (4, [42, 17, 8, 99, 150, 1, 2, 3, 4, 5], 50),  # runs into the 64-position window: k shrinks
    (6, [11, 12], 1),
]


@pytest.mark.parametrize("draft", ["lm", "lm-teacher"], ids=["student-draft", "teacher-as-its-own-draft"])
@pytest.mark.parametrize("k", [1, 4])
def test_greedy_output_is_the_teachers_own_under_continuous_batching(
    loaded: Loaded, draft: str, k: int
) -> None:
    alone = generate(DecoderRunner(*loaded["lm-teacher"]), REQUESTS)
    speculative = SpeculativeRunner(
        DecoderRunner(*loaded["lm-teacher"]), DecoderRunner(*loaded[draft]), k, 64
    )
    assert generate(speculative, REQUESTS) == alone


@pytest.mark.parametrize("confidence", [0.0, 0.5], ids=["k-a-round", "ending-rounds-unsure"])
def test_greedy_with_a_repetition_penalty_is_the_teachers_own_too(loaded: Loaded, confidence: float) -> None:
    alone = generate(DecoderRunner(*loaded["lm-teacher"]), REQUESTS, repetition_penalty=1.3)
    speculative = SpeculativeRunner(
        DecoderRunner(*loaded["lm-teacher"]), DecoderRunner(*loaded["lm"]), 3, 64, confidence=confidence
    )
    results: list[StepResult] = []
    assert generate(speculative, REQUESTS, results=results, repetition_penalty=1.3) == alone
    most = max(r.drafted // len(r.more) for r in results if r.more)  # `more`: each decoded row's
    # this untrained draft is never 0.5 sure (its top ~0.004): each round ends after one draft; without, k
    assert most == (1 if confidence else 3)


def test_drafting_stops_while_more_sequences_than_its_cap_decode(loaded: Loaded) -> None:
    """Above `max_batch` decoding rows the teacher decodes alone; once they thin out the draft catches up
    on the running contexts and drafts again; the text is the teacher's throughout."""
    alone = generate(DecoderRunner(*loaded["lm-teacher"]), REQUESTS)
    runner = SpeculativeRunner(
        DecoderRunner(*loaded["lm-teacher"]), DecoderRunner(*loaded["lm"]), 3, 64, max_batch=2
    )
    results: list[StepResult] = []
    assert generate(runner, REQUESTS, results=results) == alone
    crowded = [i for i, r in enumerate(results) if len(r.more) > 2]  # `more`: each decoded row's
    assert crowded and all(results[i].drafted == results[i].checked == 0 for i in crowded)
    assert any(r.drafted > 0 for r in results[: crowded[0]])
    assert any(r.drafted > 0 for r in results[crowded[-1] :])  # drafting again, after catching up


@pytest.mark.parametrize(
    "drafts", [("lm-teacher",), (None,), (None, "lm")], ids=["a-new-draft", "none", "none-then-one"]
)
def test_a_draft_replaced_while_sequences_run_keeps_the_teachers_text(
    loaded: Loaded, drafts: tuple[str | None, ...]
) -> None:
    """A student's new version (or none) handed over mid-generation: the running sequences' contexts are
    prefilled into the new draft, and the text stays the teacher's own."""
    alone = generate(DecoderRunner(*loaded["lm-teacher"]), REQUESTS)
    runner = SpeculativeRunner(DecoderRunner(*loaded["lm-teacher"]), DecoderRunner(*loaded["lm"]), 3, 64)
    swaps = dict(zip((3, 9), drafts, strict=False))  # at steps 3 and 9, with sequences running

    def swap(step: int) -> None:
        if step in swaps:
            name = swaps[step]
            runner.replace_draft(None if name is None else DecoderRunner(*loaded[name]))

    results: list[StepResult] = []
    assert generate(runner, REQUESTS, before_step=swap, results=results) == alone
    last = drafts[-1]
    after = [r for r in results[max(swaps) :] if r.more]  # steps that decoded
    assert after
    if last is None:  # the teacher alone: one token a step, nothing drafted
        assert all(r.drafted == 0 and not any(r.more.values()) for r in after)
    elif last == "lm-teacher":  # the teacher as its own draft: every draft kept
        assert all(r.accepted == r.drafted for r in after) and sum(r.drafted for r in after) > 0
    else:
        assert sum(r.drafted for r in after) > 0


def test_a_perfect_draft_is_always_kept(loaded: Loaded) -> None:
    runner = SpeculativeRunner(
        DecoderRunner(*loaded["lm-teacher"]), DecoderRunner(*loaded["lm-teacher"]), 4, 64
    )
    seq = Sequence(prompt=[5, 9, 13], params=SamplingParams(max_new_tokens=40))
    result = runner.execute(StepPlan(prefill=[seq], decode=[]))
    seq.output.append(result.tokens[seq.id])
    result = runner.execute(StepPlan(prefill=[], decode=[seq]))
    assert (result.drafted, result.accepted, result.checked) == (4, 4, 1)
    assert len(result.more[seq.id]) == 4  # five tokens for one teacher pass


class RecordingRunner(DecoderRunner):
    """A draft that records each decode pass (engine call after a past): the tokens it took, and the
    highest probability it gave its next token (over rows)."""

    def __init__(self, engine: Engine, layout: GenerationLayout) -> None:
        super().__init__(engine, layout)
        self.widths: list[int] = []
        self.tops: list[float] = []

    def run_step(
        self,
        input_ids: np.ndarray,
        mask: np.ndarray,
        positions: np.ndarray,
        past: list[LayerCache],
        last_only: bool = False,
    ) -> dict[str, Any]:
        out = super().run_step(input_ids, mask, positions, past, last_only)
        scores = out["logits"][:, -1].astype(np.float64)
        weights = np.exp(scores - scores.max(axis=-1, keepdims=True))
        self.widths.append(int(input_ids.shape[1]))
        self.tops.append(float((weights.max(axis=-1) / weights.sum(axis=-1)).max()))
        return out


class PrefillRecordingRunner(DecoderRunner):
    """A draft that records the prompts it is asked to prefill, in lockstep or to catch up."""

    def __init__(
        self, engine: Engine, layout: GenerationLayout, prefill_tokens: int = PREFILL_TOKENS
    ) -> None:
        super().__init__(engine, layout, prefill_tokens)
        self.prefilled: list[list[int]] = []

    def prefill(
        self, seqs: Any, choose: bool = True, logprobs: StepLogprobs | None = None, whole: bool = True
    ) -> dict[int, int]:
        self.prefilled += [s.prompt for s in seqs]
        return super().prefill(seqs, choose, logprobs, whole)

    def prefill_aside(self, seqs: Any) -> None:
        self.prefilled += [s.prompt for s in seqs]
        super().prefill_aside(seqs)


def test_a_first_token_does_not_wait_for_the_drafts_prefill(loaded: Loaded) -> None:
    """A prompt prefilled whole is the teacher's alone, alone or beside a decoding sequence; the draft
    prefills its context at the next step, before drafting. A chunked prompt goes in lockstep."""
    draft = PrefillRecordingRunner(*loaded["lm"], prefill_tokens=8)
    teacher = DecoderRunner(*loaded["lm-teacher"], prefill_tokens=8)
    runner = SpeculativeRunner(teacher, draft, 3, 64)
    seq = Sequence(prompt=[5, 9, 13], params=SamplingParams(max_new_tokens=20))
    first = runner.execute(StepPlan(prefill=[seq], decode=[]))
    assert draft.prefilled == []
    seq.output.append(first.tokens[seq.id])
    second = runner.execute(StepPlan(prefill=[], decode=[seq]))
    assert draft.prefilled == [[5, 9, 13]] and second.drafted == 3
    seq.output += [second.tokens[seq.id], *second.more[seq.id]]

    joining = Sequence(prompt=[7, 7, 7], params=SamplingParams(max_new_tokens=4))
    joined = runner.execute(StepPlan(prefill=[joining], decode=[seq]))  # beside one decoding, whole
    assert draft.prefilled == [[5, 9, 13]]
    seq.output += [joined.tokens[seq.id], *joined.more[seq.id]]
    joining.output.append(joined.tokens[joining.id])
    runner.execute(StepPlan(prefill=[], decode=[seq, joining]))
    assert draft.prefilled == [[5, 9, 13], [7, 7, 7]]  # caught up before drafting

    long = Sequence(prompt=list(range(20, 32)), params=SamplingParams(max_new_tokens=4))
    runner.execute(StepPlan(prefill=[long], decode=[seq]))  # 12 positions, 8 a call: chunked
    assert draft.prefilled[-1] == list(range(20, 32))  # its chunks in lockstep with the teacher's


@pytest.mark.parametrize("draft", ["lm", "lm-teacher"], ids=["student-draft", "teacher-as-its-own-draft"])
def test_a_round_of_k_drafts_costs_k_draft_passes(loaded: Loaded, draft: str) -> None:
    """No pass feeds the k-th draft only to cache it: a row that kept all k drafts has it fed with the
    teacher's next token in the next round's first pass (two tokens wide; otherwise one)."""
    counting = RecordingRunner(*loaded[draft])
    runner = SpeculativeRunner(DecoderRunner(*loaded["lm-teacher"]), counting, 3, 64)
    results: list[StepResult] = []
    requests = [(0, [5, 9, 13, 2], 24), (0, [7, 7, 7], 24)]
    alone = generate(DecoderRunner(*loaded["lm-teacher"]), requests)
    assert generate(runner, requests, results=results) == alone
    rounds = [r for r in results if r.more]  # steps that decoded (`more`: each row's)
    firsts, at = [], 0
    for r in rounds:  # each round's passes: k of them (one when k is 0 at the end)
        firsts.append(counting.widths[at])
        assert set(counting.widths[at + 1 : at + max(r.drafted // len(r.more), 1)]) <= {1}
        at += max(r.drafted // len(r.more), 1)
    assert at == len(counting.widths)
    kept_all = [
        r.drafted > 0 and any(len(m) == r.drafted // len(r.more) for m in r.more.values()) for r in rounds
    ]
    assert all(kept for kept, first in zip(kept_all, firsts[1:], strict=False) if first == 2)
    assert firsts[0] == 1 and 2 in firsts
    if draft == "lm-teacher":  # every draft kept: each round after a drafting one takes two tokens
        assert all(first == 2 for kept, first in zip(kept_all, firsts[1:], strict=False) if kept)


def rounds(results: list[StepResult], k: int, length: int) -> list[tuple[StepResult, int]]:
    """One sequence's decoding steps, each with the most it could draft (k, fewer near its last token)."""
    produced, out = 1, []
    for r in [r for r in results if r.more]:
        out.append((r, max(0, min(k, length - produced - 1))))
        produced += 1 + sum(len(m) for m in r.more.values())
    return out


@pytest.mark.parametrize("quantile", [0.3, 0.6])
def test_a_round_drafts_on_while_the_draft_is_sure_and_no_further(loaded: Loaded, quantile: float) -> None:
    """With a confidence, a round drafts up to k tokens and ends after the first the draft gave less than
    that probability; the text stays the teacher's. (The confidence: a quantile of the probabilities this
    untrained draft gives, so that some rounds end early and others draft on.)"""
    k, length = 4, 40
    requests = [(0, [5, 9, 13, 2], length)]
    probing = RecordingRunner(*loaded["lm"])
    generate(SpeculativeRunner(DecoderRunner(*loaded["lm-teacher"]), probing, k, 64), requests)
    confidence = float(np.quantile(probing.tops, quantile))
    probing.tops.clear()
    runner = SpeculativeRunner(DecoderRunner(*loaded["lm-teacher"]), probing, k, 64, confidence=confidence)
    alone = generate(DecoderRunner(*loaded["lm-teacher"]), requests)
    results: list[StepResult] = []
    assert generate(runner, requests, results=results) == alone
    at, lengths = 0, []
    for r, cap in rounds(results, k, length):
        tops = probing.tops[at : at + max(r.drafted, 1)]  # this round's draft passes
        if r.drafted:
            assert all(top >= confidence for top in tops[:-1])
            assert r.drafted == cap or tops[-1] < confidence
            lengths.append(r.drafted)
        at += max(r.drafted, 1)
    assert at == len(probing.tops)  # every decode pass accounted for
    assert 1 in lengths and max(lengths) > 1  # rounds ended early, and others drafted on


def test_without_a_confidence_every_round_drafts_k(loaded: Loaded) -> None:
    runner = SpeculativeRunner(DecoderRunner(*loaded["lm-teacher"]), DecoderRunner(*loaded["lm"]), 3, 64)
    results: list[StepResult] = []
    generate(runner, [(0, [5, 9, 13, 2], 30)], results=results)
    assert all(r.drafted == cap for r, cap in rounds(results, 3, 30))


def sampled_openings(
    runner: DecoderRunner | SpeculativeRunner,
    seeds: range,
    drafted: list[int] | None = None,
    shaping: dict[str, Any] | None = None,
) -> dict[tuple[int, ...], int]:
    """How often each first three tokens came, one seeded sequence a seed (temperature 1, top-k 2, four
    tokens asked: room for two drafts after the first; `shaping`: a bias or penalties besides); `drafted`:
    each sequence's first round's drafts."""
    counts: dict[tuple[int, ...], int] = {}
    for seed in seeds:
        params = SamplingParams(max_new_tokens=4, temperature=1.0, top_k=2, seed=seed, **(shaping or {}))
        seq = Sequence(prompt=[5, 9, 13], params=params)
        plan = StepPlan(prefill=[seq], decode=[])
        while len(seq.output) < 3:
            result = runner.execute(plan)
            seq.output += [result.tokens[seq.id], *result.more.get(seq.id, ())]
            if drafted is not None and plan.decode and len(seq.output) - len(result.more[seq.id]) == 2:
                drafted.append(result.drafted)
            plan = StepPlan(prefill=[], decode=[seq])
        opening = tuple(seq.output[:3])
        counts[opening] = counts.get(opening, 0) + 1
    return counts


def one_distribution(drafted: dict[tuple[int, ...], int], alone: dict[tuple[int, ...], int]) -> bool:
    """Whether two samples' counts pass a chi-square test of homogeneity at p = 0.001."""
    cells = sorted(set(drafted) | set(alone))
    table = np.array([[drafted.get(c, 0) for c in cells], [alone.get(c, 0) for c in cells]], dtype=np.float64)
    expected = table.sum(axis=1, keepdims=True) * table.sum(axis=0, keepdims=True) / table.sum()
    statistic = float(((table - expected) ** 2 / expected).sum())
    dof = len(cells) - 1  # chi-square's p = 0.001 point, Wilson-Hilferty's (7 degrees: 24.53, exact 24.32)
    return statistic < dof * (1 - 2 / (9 * dof) + 3.090 * (2 / (9 * dof)) ** 0.5) ** 3


@pytest.mark.parametrize("confidence", [0.0, 0.5], ids=["k-a-round", "ending-rounds-unsure"])
def test_sampled_text_drafted_is_distributed_as_the_teachers_alone(loaded: Loaded, confidence: float) -> None:
    """The runner end to end, sampling: the first three tokens of 1,200 seeded sequences drafted (k 2, a
    round ended early or not) and of 1,200 others from the teacher alone come from one distribution (a
    chi-square test of homogeneity, p = 0.001). Where a round ends depends on the draft alone (the drawn
    token's probability under top-k 2: either side of 0.5), so the rule still keeps the teacher's."""
    teacher = DecoderRunner(*loaded["lm-teacher"])
    runner = SpeculativeRunner(teacher, DecoderRunner(*loaded["lm"]), 2, 64, confidence=confidence)
    rounds: list[int] = []
    drafted = sampled_openings(runner, range(1200), rounds)
    alone = sampled_openings(DecoderRunner(*loaded["lm-teacher"]), range(10_000, 11_200))
    assert one_distribution(drafted, alone)
    assert len(rounds) == 1200
    assert set(rounds) == ({1, 2} if confidence else {2})


def scheduled(
    runner: DecoderRunner | SpeculativeRunner, requests: list[tuple[int, list[int], int]]
) -> list[list[int]]:
    """Continuous batching as the engine drives it: request i is added at step `arrival`, the scheduler plans
    (a long prompt a chunk a step beside the decoding ones), each token is kept up to the request's length."""
    scheduler = Scheduler(SchedulerConfig())
    seqs = [Sequence(prompt=p, params=SamplingParams(max_new_tokens=n)) for _, p, n in requests]
    step = 0
    while step <= max(arrival for arrival, _, _ in requests) or scheduler.has_work:
        for seq, (arrival, _, _) in zip(seqs, requests, strict=True):
            if arrival == step:
                scheduler.add(seq)
        plan = scheduler.schedule()
        result = runner.execute(plan)
        for s in [*plan.prefill, *plan.decode]:
            for token in (result.tokens[s.id], *result.more.get(s.id, ())) if s.id in result.tokens else ():
                if len(s.output) < s.params.max_new_tokens:
                    s.output.append(token)
            if len(s.output) == s.params.max_new_tokens:
                s.finish_reason = "length"
        step += 1
    return [s.output for s in seqs]


LONG_PROMPTS = [
    (0, [5, 9, 13, 2], 24),
    (2, list(range(100, 130)), 10),
    (3, [7, 7, 7], 20),
    (4, list(range(40, 61)), 8),
]


@pytest.mark.parametrize("draft_budget", [4, 7], ids=["lockstep", "draft-chunked-otherwise"])
def test_long_prompts_prefilled_a_chunk_a_step_keep_the_teachers_greedy_text(
    loaded: Loaded, draft_budget: int
) -> None:
    """Both models take a long prompt a chunk a step while the others draft and check; where the draft's
    chunks differ from the teacher's it catches up on the rows it lacks, and the text is the teacher's."""
    alone = scheduled(DecoderRunner(*loaded["lm-teacher"]), LONG_PROMPTS)
    speculative = SpeculativeRunner(
        DecoderRunner(*loaded["lm-teacher"], prefill_tokens=4),
        DecoderRunner(*loaded["lm"], prefill_tokens=draft_budget),
        3,
        64,
    )
    assert scheduled(speculative, LONG_PROMPTS) == alone
