"""Prefill in chunks of columns, on both decoder graphs: the same answers as one call, and a long prompt a
chunk a step between the running sequences' decode steps, a short one joining beside it."""

from __future__ import annotations

import asyncio
from typing import Any

import numpy as np
import pytest

from service.generation.engine import GenerationEngine
from service.generation.runner import DecoderRunner, StepLogprobs
from service.generation.sampling import SamplingParams
from service.generation.scheduler import Scheduler, SchedulerConfig
from service.generation.sequence import Sequence
from tests.service.generation.helpers import PROMPTS, alone, ids, run


def test_a_chunked_prefill_equals_one_call(parts: tuple[Any, ...]) -> None:
    """Prompts longer than the call budget are prefilled in chunks of columns, each chunk's presents the next
    one's past: the same first tokens, log-probabilities (prompt and token) and caches as one call, and the
    same greedy continuations once decoding."""
    engine, layout = parts[0], parts[1]
    prompts = [ids(parts, text) for text in (PROMPTS[7], PROMPTS[0], PROMPTS[2] + " " + PROMPTS[5])]
    params = SamplingParams(max_new_tokens=6, logprobs=2, prompt_logprobs=2)

    def prefill(budget: int) -> tuple[dict[int, int], StepLogprobs, list[Any]]:
        runner = DecoderRunner(engine, layout, prefill_tokens=budget)
        seqs = [Sequence(prompt, params, id=i) for i, prompt in enumerate(prompts)]
        logprobs = StepLogprobs()
        tokens = runner.prefill(seqs, logprobs=logprobs)
        return tokens, logprobs, [runner._prefilled[s.id] for s in seqs]

    whole_tokens, whole_logprobs, whole_caches = prefill(10_000)
    assert max(len(p) for p in prompts) > 5  # three rows at a budget of 8: chunks of 2 columns
    chunked_tokens, chunked_logprobs, chunked_caches = prefill(8)
    assert chunked_tokens == whole_tokens
    for seq_id, prompt in enumerate(prompts):
        whole, chunked = whole_logprobs.prompts.get(seq_id, []), chunked_logprobs.prompts.get(seq_id, [])
        assert len(chunked) == len(prompt) - 1
        for (lp_whole, alt_whole), (lp_chunked, alt_chunked) in zip(whole, chunked, strict=True):
            assert lp_chunked == pytest.approx(lp_whole, abs=1e-4)
            assert [t for t, _ in alt_chunked] == [t for t, _ in alt_whole]
        assert chunked_logprobs.tokens[seq_id][0][0] == pytest.approx(
            whole_logprobs.tokens[seq_id][0][0], abs=1e-4
        )
    for whole_cache, chunked_cache in zip(whole_caches, chunked_caches, strict=True):
        for (wk, wv), (ck, cv) in zip(whole_cache, chunked_cache, strict=True):
            assert ck.shape == wk.shape
            np.testing.assert_allclose(ck, wk, atol=1e-4)
            np.testing.assert_allclose(cv, wv, atol=1e-4)

    async def continuations(budget: int) -> list[list[int]]:
        generation = GenerationEngine(
            DecoderRunner(engine, layout, prefill_tokens=budget),
            Scheduler(SchedulerConfig()),
            parts[2].text_stream,
            None,
            parts[3],
        )
        generation.start()
        done = await asyncio.gather(
            *(generation.generate(p, SamplingParams(max_new_tokens=8)) for p in prompts)
        )
        await generation.close()
        return [seq.output for seq, _ in done]

    assert run(continuations(3)) == run(continuations(10_000))


def test_a_long_prompt_goes_through_a_chunk_a_step_while_the_others_decode(parts: tuple[Any, ...]) -> None:
    """Sequences already decoding get a token every step while a newcomer's long prompt is prefilled a chunk
    at a time (they wait for a chunk, not the whole prompt); its first token comes with its last chunk, with
    all its prompt's log-probabilities. A short prompt arriving meanwhile joins beside it and gets its first
    token at once. Every output equals the sequence's alone."""
    engine, layout = parts[0], parts[1]
    params = SamplingParams(max_new_tokens=12, prompt_logprobs=1)
    early = [Sequence(ids(parts, text), params) for text in PROMPTS[:2]]
    late = Sequence(ids(parts, PROMPTS[2] + " " + PROMPTS[5]), params)
    short = Sequence(ids(parts, "Who"), params)
    scheduler = Scheduler(SchedulerConfig(prefill_tokens=4))
    runner = DecoderRunner(engine, layout, prefill_tokens=4)
    plans: list[tuple[list[int], list[int], list[int]]] = []  # prefill, decode, who got a token
    prompt_logprobs: dict[int, Any] = {}
    for s in early:
        scheduler.add(s)
    while scheduler.has_work:
        if len(early[0].output) == 2 and late not in scheduler.running:
            scheduler.add(late)
        if plans and plans[-1][0] == [late.id] and short not in scheduler.running:  # a chunk of it has run
            scheduler.add(short)
        plan = scheduler.schedule()
        result = runner.execute(plan)
        for s in [*plan.prefill, *plan.decode]:
            if s.id in result.tokens:
                s.output.append(result.tokens[s.id])
                s.finish_reason = "length" if len(s.output) == params.max_new_tokens else None
        prompt_logprobs |= result.logprobs.prompts
        got = [s.id for s in [*plan.prefill, *plan.decode] if s.id in result.tokens]
        plans.append(([s.id for s in plan.prefill], [s.id for s in plan.decode], got))

    chunks = [(prefill, decode, got) for prefill, decode, got in plans if late.id in prefill]
    assert len(chunks) == -(-len(late.prompt) // 4) > 3  # a chunk of 4 columns a step
    for _, decode, got in chunks[:-1]:
        assert set(decode) <= set(got) and late.id not in got  # they decoded; the long prompt goes on
    assert late.id in chunks[-1][2]  # its first token with its last chunk
    [(_, _, got)] = [c for c in chunks if c[0] == [late.id, short.id]]
    assert short.id in got  # joined beside the long prompt, prefilled whole: its first token at once
    assert len(prompt_logprobs[late.id]) == len(late.prompt) - 1
    whole = StepLogprobs()
    DecoderRunner(engine, layout).prefill([Sequence(late.prompt, params, id=late.id)], logprobs=whole)
    for (lp, _), (lp_whole, _) in zip(prompt_logprobs[late.id], whole.prompts[late.id], strict=True):
        assert lp == pytest.approx(lp_whole, abs=1e-4)
    plain = SamplingParams(max_new_tokens=12)
    everyone = [*early, late, short]
    assert [s.output for s in everyone] == [alone(parts, s.prompt, plain) for s in everyone]
