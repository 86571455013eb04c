"""Continuous batching on the exported tiny GPT-2: alone, in company, joining mid-flight, against PyTorch."""

from __future__ import annotations

import asyncio
import itertools
import threading
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from service.generation.engine import GenerationEngine
from service.generation.runner import DecoderRunner
from service.generation.sampling import SamplingParams
from service.generation.scheduler import Scheduler, SchedulerConfig, StepPlan
from service.generation.sequence import Sequence
from service.generation.slot_cache import ROOM
from tests.service.generation.helpers import PROMPTS, alone, ids, make_engine, run


def test_greedy_alone_equals_pytorch_generate(parts: tuple[Any, ...], tiny_models: dict[str, Path]) -> None:
    from transformers import AutoModelForCausalLM

    from export.greedy import greedy_torch

    model = AutoModelForCausalLM.from_pretrained(tiny_models["text-generation"]).eval()
    for text in PROMPTS[:4]:
        prompt = ids(parts, text)
        expected = greedy_torch(model, prompt, 16, parts[1].eos_token_id)
        assert alone(parts, prompt, SamplingParams(max_new_tokens=16)) == expected


def test_greedy_is_identical_inside_a_running_batch_joined_at_different_steps(parts: tuple[Any, ...]) -> None:
    params = SamplingParams(max_new_tokens=20)
    prompts = [ids(parts, p) for p in PROMPTS]
    expected = [alone(parts, p, params) for p in prompts]

    async def main() -> list[list[int]]:
        engine = make_engine(parts)
        engine.start()
        sequences = []
        for i, prompt in enumerate(prompts):
            sequences.append(engine.submit(prompt, params))
            # let the running batch take a few steps before the next request joins
            while len(sequences[0].output) < 2 * (i + 1) and not sequences[0].done:
                await asyncio.sleep(0.001)
        outputs = await asyncio.gather(*(_collect(engine, s) for s in sequences))
        await engine.close()
        return outputs

    got = run(main())
    assert got == expected
    assert len({len(p) for p in prompts}) > 4  # the prompts really differ in length


async def _collect(engine: GenerationEngine, seq: Any) -> list[int]:
    async for _ in engine.stream(seq):
        pass
    return list(seq.output)


def test_seeded_sampling_does_not_depend_on_the_company(parts: tuple[Any, ...]) -> None:
    params = SamplingParams(max_new_tokens=12, temperature=0.9, top_p=0.95, top_k=50, seed=7)
    prompt = ids(parts, PROMPTS[1])
    solo = alone(parts, prompt, params)

    async def main() -> list[int]:
        engine = make_engine(parts)
        engine.start()
        others = [
            engine.submit(ids(parts, p), SamplingParams(max_new_tokens=12, temperature=1.0))
            for p in PROMPTS[2:6]
        ]
        target = engine.submit(prompt, params)
        result = await _collect(engine, target)
        await asyncio.gather(*(_collect(engine, o) for o in others))
        await engine.close()
        return result

    assert run(main()) == solo


def test_stop_strings_and_length_end_a_sequence(parts: tuple[Any, ...]) -> None:
    prompt = ids(parts, PROMPTS[0])
    free, text = run(_generate(parts, prompt, SamplingParams(max_new_tokens=16)))
    assert free.finish_reason in ("length", "eos") and len(free.output) <= 16
    if free.finish_reason == "length" and len(text) > 4:
        stop = text[2:4]
        stopped, stopped_text = run(_generate(parts, prompt, SamplingParams(max_new_tokens=16, stop=(stop,))))
        assert stopped.finish_reason == "stop"
        assert stopped_text == text[: text.find(stop)]
        assert stop not in stopped_text


def test_a_stop_string_ends_the_stream_though_the_engine_ran_ahead(parts: tuple[Any, ...]) -> None:
    """The engine thread may compute a token or two past a stop string before the event loop finds it: the
    client must see none of them, and the counts must be of what it was sent."""
    prompt = ids(parts, PROMPTS[0])
    params = SamplingParams(max_new_tokens=24, ignore_eos=True)
    free, text = run(_generate(parts, prompt, params))
    stop = text[len(text) // 3 : len(text) // 3 + 2]
    assert stop.strip(), text

    async def main() -> tuple[Any, list[Any]]:
        engine = make_engine(parts)
        engine.start()
        seq = engine.submit(prompt, SamplingParams(max_new_tokens=24, ignore_eos=True, stop=(stop,)))
        events = [event async for event in engine.stream(seq)]
        await asyncio.sleep(0.05)  # let the engine thread finish whatever step it had started
        await engine.close()
        return seq, events

    seq, events = run(main())
    assert [e.index for e in events] == list(range(len(events)))
    assert events[-1].finish_reason == "stop" and all(e.finish_reason is None for e in events[:-1])
    assert seq.streamed == len(events) and seq.finish_reason == "stop"
    assert "".join(e.text for e in events) == text[: text.find(stop)]
    assert [e.token_id for e in events] == free.output[: len(events)]


def test_ignore_eos_runs_to_the_token_limit_with_the_same_tokens(parts: tuple[Any, ...]) -> None:
    prompt = ids(parts, PROMPTS[0])
    free = alone(parts, prompt, SamplingParams(max_new_tokens=6))
    eos = free[2]  # pretend the model's third token ends the sequence
    stopped, _ = run(_generate(parts, prompt, SamplingParams(max_new_tokens=6), eos=eos))
    assert stopped.finish_reason == "eos" and stopped.output == free[: free.index(eos) + 1]
    kept, _ = run(_generate(parts, prompt, SamplingParams(max_new_tokens=6, ignore_eos=True), eos=eos))
    assert kept.finish_reason == "length" and kept.output == free


def _streamed(parts: tuple[Any, ...], prompt: list[int], params: SamplingParams) -> list[Any]:
    async def main() -> list[Any]:
        engine = make_engine(parts)
        engine.start()
        events = [event async for event in engine.stream(engine.submit(prompt, params))]
        await engine.close()
        return events

    return list(run(main()))


def test_a_stop_string_split_across_tokens_is_never_half_sent(parts: tuple[Any, ...]) -> None:
    """The stream holds back text that could be the start of a stop string: what the client was sent,
    joined, is the final text, and no event carries the first half of a stop that the next token completes.
    """
    prompt = ids(parts, PROMPTS[0])
    free = _streamed(parts, prompt, SamplingParams(max_new_tokens=24, ignore_eos=True))
    text, at, stop = "".join(e.text for e in free), 0, ""
    for before, after in itertools.pairwise(free):
        at += len(before.text)
        candidate = before.text[-1:] + after.text[:1]
        if len(candidate) == 2 and text.find(candidate) == at - 1:  # first occurs across this boundary
            stop = candidate
            break
    assert stop, [e.text for e in free]
    events = _streamed(parts, prompt, SamplingParams(max_new_tokens=24, ignore_eos=True, stop=(stop,)))
    assert events[-1].finish_reason == "stop"
    assert "".join(e.text for e in events) == text[: text.find(stop)]
    plain = _streamed(parts, prompt, SamplingParams(max_new_tokens=24, ignore_eos=True, stop=("\x00",)))
    assert [e.text for e in plain] == [e.text for e in free]  # nothing held back when no stop can start


async def _generate(
    parts: tuple[Any, ...], prompt: list[int], params: SamplingParams, eos: int | None = -1
) -> tuple[Any, str]:
    engine = make_engine(parts, eos=eos)
    engine.start()
    result = await engine.generate(prompt, params)
    await engine.close()
    return result


def test_a_client_that_leaves_frees_its_slot(parts: tuple[Any, ...]) -> None:
    async def main() -> None:
        engine = make_engine(parts, max_running=1)
        engine.start()
        leaver = engine.submit(ids(parts, PROMPTS[1]), SamplingParams(max_new_tokens=200))
        waiter = engine.submit(ids(parts, PROMPTS[2]), SamplingParams(max_new_tokens=3))
        stream = engine.stream(leaver)
        await stream.__anext__()  # one token, then the client goes away
        await stream.aclose()
        assert leaver.aborted
        await asyncio.wait_for(_collect(engine, waiter), timeout=10)  # it gets the slot
        assert len(leaver.output) < 200
        await engine.close()

    run(main())


class FailsOnce:
    """An engine whose next call raises, then works: a step failing mid-generation."""

    def __init__(self, engine: Any) -> None:
        self.engine = engine
        self.input_names = engine.input_names
        self.armed = False

    def run(self, feeds: dict[str, Any]) -> dict[str, Any]:
        if self.armed:
            self.armed = False
            raise RuntimeError("engine exploded")
        return self.engine.run(feeds)


def test_a_failing_step_fails_its_sequences_and_the_engine_serves_on(parts: tuple[Any, ...]) -> None:
    engine, layout, encoder, executor = parts
    flaky = FailsOnce(engine)
    prompt = ids(parts, PROMPTS[0])
    expected = alone(parts, prompt, SamplingParams(max_new_tokens=4, ignore_eos=True))

    async def main() -> None:
        gen = GenerationEngine(
            DecoderRunner(flaky, layout), Scheduler(SchedulerConfig()), encoder.text_stream, None, executor
        )
        gen.start()
        flaky.armed = True
        with pytest.raises(RuntimeError, match="engine exploded"):
            await gen.generate(prompt, SamplingParams(max_new_tokens=4, ignore_eos=True))
        seq, _ = await gen.generate(prompt, SamplingParams(max_new_tokens=4, ignore_eos=True))
        assert seq.output == expected and seq.finish_reason == "length"
        await gen.close()

    run(main())


def test_joins_and_leaves_keep_every_sequence_exact_and_the_cache_bounded(parts: tuple[Any, ...]) -> None:
    """The runner alone under churn: a sequence joins every other step and each leaves at its own length, so
    rows are freed and refilled around the ones that stay. Every output equals the sequence run alone, and
    the cache never holds more than the running rows' longest sequence plus twice ROOM spare columns."""
    engine, layout = parts[0], parts[1]
    prompts = [ids(parts, p) for p in PROMPTS * 2]
    lengths = [5 + (7 * i) % 11 for i in range(len(prompts))]  # 5..15 new tokens, all different neighbours

    def solo(prompt: list[int], n: int) -> list[int]:
        runner, seq = DecoderRunner(engine, layout), Sequence(prompt, SamplingParams(max_new_tokens=n))
        plan = StepPlan(prefill=[seq], decode=[])
        while len(seq.output) < n:
            seq.output.append(runner.execute(plan).tokens[seq.id])
            plan = StepPlan(prefill=[], decode=[seq])
        return seq.output

    runner = DecoderRunner(engine, layout)
    waiting = [Sequence(p, SamplingParams(max_new_tokens=n)) for p, n in zip(prompts, lengths, strict=True)]
    everyone, running, step = list(waiting), list[Sequence](), 0
    while waiting or running:
        joining = [waiting.pop(0)] if waiting and step % 2 == 0 else []
        plan = StepPlan(prefill=joining, decode=running)
        tokens = runner.execute(plan).tokens
        for seq in [*joining, *running]:
            seq.output.append(tokens[seq.id])
        if running:  # they decoded this step: the cache holds them, and their last token is not cached yet
            cache = runner._cache
            assert cache is not None and sorted(cache.ids) == sorted(s.id for s in running)
            longest = max(len(s.prompt) + len(s.output) - 1 for s in running)
            assert longest < cache.columns <= longest + 2 * ROOM
        running = [s for s in [*running, *joining] if len(s.output) < s.params.max_new_tokens]
        step += 1
    assert [s.output for s in everyone] == [solo(p, n) for p, n in zip(prompts, lengths, strict=True)]


def test_a_stream_interval_groups_fast_tokens_and_hands_the_first_out_at_once(parts: tuple[Any, ...]) -> None:
    """Hand-outs at least `interval` apart (tokens due meanwhile wait and go together), the first at once,
    and every token in order: the same tokens as one by one."""
    prompt = ids(parts, PROMPTS[1])
    params = SamplingParams(max_new_tokens=32, ignore_eos=True)
    interval = 0.1
    one_by_one = alone(parts, prompt, params)  # (and the session is warm: no first-call cost below)

    async def main() -> tuple[list[list[Any]], list[float], float]:
        engine = make_engine(parts)
        engine.start()
        loop = asyncio.get_running_loop()
        submitted = loop.time()
        groups, times = [], []
        async for group in engine.stream_groups(engine.submit(prompt, params), interval_s=interval):
            groups.append(group)
            times.append(loop.time())
        await engine.close()
        return groups, times, submitted

    groups, times, submitted = run(main())
    events = [e for g in groups for e in g]
    assert [e.index for e in events] == list(range(32)) and events[-1].finish_reason == "length"
    assert [e.token_id for e in events] == one_by_one
    assert len(groups) < len(events)  # 32 tokens of a tiny model come faster than one per 0.1 s
    assert times[0] - submitted < interval  # the first token did not wait for the interval
    gaps = [b - a for a, b in itertools.pairwise(times)]
    assert all(gap >= interval - 0.01 for gap in gaps), gaps  # (the loop may fire a timer 1 tick early)


@dataclass
class Hold:
    after_prefill: bool  # hold the first decode call after a prefill call, not the next one
    holding: threading.Event = field(default_factory=threading.Event)
    released: threading.Event = field(default_factory=threading.Event)


class HoldsDecodes:
    """An engine that holds an armed decode call (one new position) until the test releases it."""

    def __init__(self, engine: Any) -> None:
        self.engine = engine
        self.input_names = engine.input_names
        self.pending: Hold | None = None
        self.prefilled = False

    def arm(self, after_prefill: bool) -> Hold:
        self.pending, self.prefilled = Hold(after_prefill), False
        return self.pending

    def run(self, feeds: dict[str, Any]) -> dict[str, Any]:
        hold = self.pending
        if feeds["input_ids"].shape[1] > 1:
            self.prefilled = True
        elif hold is not None and (self.prefilled or not hold.after_prefill):
            self.pending = None
            hold.holding.set()
            hold.released.wait(timeout=10)
        return self.engine.run(feeds)


def test_a_newcomers_first_token_reaches_its_client_while_the_running_batch_decodes(
    parts: tuple[Any, ...],
) -> None:
    """The step a prompt joins runs its prefill, then the running sequences' decode call: the newcomer's
    first token is streamed between the two, not after both. Both texts stay their own alone."""
    engine, layout, encoder, executor = parts
    held = HoldsDecodes(engine)
    first, second = ids(parts, PROMPTS[1]), ids(parts, PROMPTS[2])
    params = SamplingParams(max_new_tokens=12, ignore_eos=True)
    expected = [alone(parts, first, params), alone(parts, second, params)]

    async def main() -> list[list[int]]:
        gen = GenerationEngine(
            DecoderRunner(held, layout), Scheduler(SchedulerConfig()), encoder.text_stream, None, executor
        )
        gen.start()
        decoding = held.arm(after_prefill=False)
        running = gen.submit(first, params)  # its first decode call held: it cannot finish before...
        await asyncio.to_thread(decoding.holding.wait, 5)
        beside = held.arm(after_prefill=True)
        joining = gen.submit(second, params)  # ...this one's prefill, then its next decode call is held
        decoding.released.set()
        events = gen.stream(joining)
        try:
            token = await asyncio.wait_for(anext(events), timeout=5)  # (released only after it came)
            assert token.token_id == expected[1][0]
            assert await asyncio.to_thread(beside.holding.wait, 5)  # the step's decode call: still held
        finally:
            beside.released.set()
            async for _ in events:
                pass
            outputs = [await _collect(gen, running), list(joining.output)]
            await gen.close()
        return outputs

    assert run(main()) == expected
