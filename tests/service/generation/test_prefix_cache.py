"""The prefix cache: prompts that begin as earlier ones did are prefilled from where their cached blocks
end, with the keys, values, first tokens and greedy text of running them whole."""

from __future__ import annotations

import json
from pathlib import Path

import httpx
import numpy as np
import pytest
from fastapi.testclient import TestClient

from service.app import create_app
from service.generation.prefix_cache import PrefixCache
from service.generation.runner import DecoderRunner, StepLogprobs, StepResult
from service.generation.sampling import SamplingParams
from service.generation.sequence import Sequence
from service.generation.speculative import SpeculativeRunner
from service.settings import Settings
from tests.conftest import TASK_MODEL_NAMES
from tests.service.generation.conftest import Loaded
from tests.service.generation.test_speculative import generate, scheduled
from tests.service.live_server import live_server
from tests.service.test_app import metric_value

SHARED = list(range(100, 140))  # 40 tokens: two whole blocks of 16, and 8 more
MIB = 1 << 20


def layers_of(prompt: list[int], layers: int = 2) -> list[tuple[np.ndarray, np.ndarray]]:
    """Keys and values [1 head, positions, 2] that hold each position's token id (values its negative)."""
    keys = np.repeat(np.array(prompt, dtype=np.float32)[None, :, None], 2, axis=2)
    return [(keys + layer, -keys - layer) for layer in range(layers)]


def test_a_prompt_finds_the_blocks_it_begins_with_and_still_runs_its_last_token() -> None:
    cache = PrefixCache(MIB, block=4)
    prompt = list(range(1, 11))  # two whole blocks and two tokens
    cache.add(prompt, layers_of(prompt))
    assert len(cache) == 2
    hit = cache.longest(prompt)
    assert hit is not None and hit.tokens == 8 == cache.cached_length(prompt)
    assert hit.layers[1][0][0, :, 0].tolist() == [t + 1 for t in prompt[:8]]
    assert hit.layers[1][1][0, :, 1].tolist() == [-t - 1 for t in prompt[:8]]
    exactly_two_blocks = cache.longest(prompt[:8])
    assert exactly_two_blocks is not None and exactly_two_blocks.tokens == 4  # its last token runs
    assert cache.longest([99, *prompt[1:]]) is None  # block 2's tokens alike, behind another block 1
    assert cache.cached_length([99, *prompt[1:]]) == 0 and cache.cached_length(prompt[:8]) == 4
    first_only = cache.longest([*prompt[:4], 0, 0, 0, 0, 0])
    assert first_only is not None and first_only.tokens == 4
    assert cache.longest(prompt[:4]) is None


def test_the_least_recently_used_blocks_leave_past_the_budget() -> None:
    one_block = 2 * 2 * 1 * 4 * 2 * 4  # layers x (keys, values) x heads x tokens x head dim x 4 bytes
    cache = PrefixCache(3 * one_block, block=4)
    a, b = list(range(1, 10)), list(range(50, 59))
    cache.add(a, layers_of(a))
    cache.add(b, layers_of(b))
    assert cache.bytes == 3 * one_block and cache.longest(a) is None  # a's first block went first
    hit = cache.longest(b)
    assert hit is not None and hit.tokens == 8
    cache.add(a, layers_of(a))  # a again: its second block, kept, is used again; b's first is now the oldest
    hit = cache.longest(a)
    assert hit is not None and hit.tokens == 8
    assert cache.longest(b) is None and cache.bytes == 3 * one_block


@pytest.mark.parametrize("prefill_tokens", [512, 8], ids=["one-call", "chunked"])
def test_a_cached_start_gives_what_running_the_prompt_whole_gives(
    loaded: Loaded, prefill_tokens: int
) -> None:
    """In one batch: a prompt with two cached blocks, one without, one with a single block (the past's
    columns then have gaps), and one that asks its prompt's log-probabilities (run whole): the same first
    tokens and log-probabilities, and the same keys and values, as a runner without a cache."""
    engine, layout = loaded["lm-teacher"]
    plain = DecoderRunner(engine, layout, prefill_tokens)
    cached = DecoderRunner(engine, layout, prefill_tokens, prefix_cache_bytes=MIB)
    cached.prefill([Sequence([*SHARED, 1], SamplingParams(max_new_tokens=4))])
    assert cached.take_prompt_counts() == (41, 0)
    params = SamplingParams(max_new_tokens=4, logprobs=1)
    prompts = [
        ([*SHARED, 5, 9, 13], params),
        ([7, 7], params),
        ([*SHARED[:17], 3], params),
        ([*SHARED, 2], SamplingParams(max_new_tokens=4, logprobs=1, prompt_logprobs=1)),
    ]
    seqs = {
        name: [Sequence(list(p), q, id=1000 + i) for i, (p, q) in enumerate(prompts)]
        for name in ("plain", "cached")
    }
    logprobs = {name: StepLogprobs() for name in seqs}
    first = {
        name: runner.prefill(seqs[name], logprobs=logprobs[name])
        for name, runner in (("plain", plain), ("cached", cached))
    }
    assert cached.take_prompt_counts() == (sum(len(p) for p, _ in prompts), 32 + 16)
    assert first["cached"] == first["plain"]
    for seq_id, want in logprobs["plain"].tokens.items():
        assert logprobs["cached"].tokens[seq_id][0][0] == pytest.approx(want[0][0], abs=1e-4)
    for (got, _), (want, _) in zip(
        logprobs["cached"].prompts[1003], logprobs["plain"].prompts[1003], strict=True
    ):
        assert got == pytest.approx(want, abs=1e-4)
    for seq_id in first["plain"]:
        for (k, v), (k0, v0) in zip(cached._prefilled[seq_id], plain._prefilled[seq_id], strict=True):
            assert k.shape == k0.shape
            np.testing.assert_allclose(k, k0, atol=1e-5)
            np.testing.assert_allclose(v, v0, atol=1e-5)


def test_prompts_that_begin_alike_keep_the_greedy_text_under_continuous_batching(loaded: Loaded) -> None:
    """Prompts arriving over several steps, some beginning with the same 40 tokens, beside running ones: each
    reads the blocks an earlier one left (counted in the step's result) and writes the same greedy text."""
    requests = [
        (0, [*SHARED, 5, 9], 8),
        (0, [7, 7, 7], 8),
        (3, [*SHARED, 13, 2, 8], 8),
        (5, [*SHARED[:20], 4], 8),
        (6, [*SHARED, 5, 9], 8),
    ]
    alone = generate(DecoderRunner(*loaded["lm-teacher"]), requests)
    results: list[StepResult] = []
    cached = generate(DecoderRunner(*loaded["lm-teacher"], prefix_cache_bytes=MIB), requests, results=results)
    assert cached == alone
    assert sum(r.prompt_tokens for r in results) == sum(len(p) for _, p, _ in requests)
    assert sum(r.cached_tokens for r in results) == 32 + 16 + 32


@pytest.mark.parametrize("drafting", [False, True], ids=["teacher-alone", "drafted"])
def test_a_finished_answer_is_cached_for_the_next_turn_that_quotes_it(loaded: Loaded, drafting: bool) -> None:
    """A sequence that finishes leaves its prompt and its answer in the prefix cache before the next step's
    prefill: the next turn, which quotes both, runs only what follows their whole blocks, and writes the
    text it writes without a cache."""
    first = SHARED[:20]

    def runner(cached: bool) -> DecoderRunner | SpeculativeRunner:
        budget = MIB if cached else 0
        teacher = DecoderRunner(*loaded["lm-teacher"], prefix_cache_bytes=budget)
        if not drafting:
            return teacher
        return SpeculativeRunner(teacher, DecoderRunner(*loaded["lm"], prefix_cache_bytes=budget), 3, 64)

    plain, cached = runner(False), runner(True)
    (answer,) = generate(plain, [(0, first, 24)])
    assert generate(cached, [(0, first, 24)]) == [answer]
    turn = [*first, *answer, 7, 8]  # the chat so far, then the next question
    results: list[StepResult] = []
    assert generate(cached, [(0, turn, 6)], results=results) == generate(plain, [(0, turn, 6)])
    fed = len(first) + len(answer) - 1  # the answer's last token was never fed
    assert sum(r.cached_tokens for r in results) == fed // 16 * 16 == 32


def test_a_teacher_and_its_draft_each_with_a_prefix_cache_keep_the_teachers_greedy_text(
    loaded: Loaded,
) -> None:
    requests = [
        (0, [*SHARED, 5], 16),
        (2, [*SHARED, 9, 9], 12),
        (3, [*SHARED[:18]], 10),
        (6, [*SHARED, 5], 16),
    ]
    alone = scheduled(DecoderRunner(*loaded["lm-teacher"]), requests)
    teacher = DecoderRunner(*loaded["lm-teacher"], prefix_cache_bytes=MIB)
    draft = DecoderRunner(*loaded["lm"], prefix_cache_bytes=MIB)
    assert scheduled(SpeculativeRunner(teacher, draft, 3, 64), requests) == alone
    assert teacher.prefixes is not None and draft.prefixes is not None
    assert len(teacher.prefixes) >= 2 and len(draft.prefixes) >= 2  # both models' blocks kept


def test_served_prompts_that_begin_alike_are_counted_and_answer_as_without_a_cache(
    lm_repository: Path,
) -> None:
    model = TASK_MODEL_NAMES["text-generation"]
    preamble = "Acme was founded by John Smith in 1950 in the city of Springfield. " * 2
    prompts = [preamble + "Who founded Acme?", preamble + "When was Acme founded?"]

    def texts(settings: Settings) -> tuple[list[str], str]:
        with TestClient(create_app(settings)) as client:
            body = {"model": model, "max_new_tokens": 6}
            replies = [client.post("/v1/generate", json=body | {"prompt": p}) for p in prompts]
            assert all(r.status_code == 200 for r in replies), [r.text for r in replies]
            out = [r.json()["generated_text"] for r in replies]
            return out, client.get("/metrics").text

    cached, metrics = texts(Settings(model_repository=lm_repository))
    plain, plain_metrics = texts(Settings(model_repository=lm_repository, gen_prefix_cache_mb=0))
    assert cached == plain
    prompt_tokens = metric_value(metrics, "distilserve_prompt_tokens_total", model=model)
    assert prompt_tokens >= 2 * 20 and prompt_tokens == metric_value(
        plain_metrics, "distilserve_prompt_tokens_total"
    )
    assert metric_value(metrics, "distilserve_prefix_cache_tokens_total", model=model) >= 16
    assert metric_value(plain_metrics, "distilserve_prefix_cache_tokens_total") == 0
    assert metric_value(metrics, "distilserve_prefix_cache_bytes", model=model) > 0  # the blocks held
    assert metric_value(plain_metrics, "distilserve_prefix_cache_bytes") == 0


def test_openai_usage_says_how_many_prompt_tokens_were_cached(lm_repository: Path) -> None:
    """`usage.prompt_tokens_details.cached_tokens`, as OpenAI reports it: none the first time a prompt is
    seen, its whole cached blocks after (whole and streamed answers alike), from the engine core through a
    frontend (`python -m service`)."""
    model = TASK_MODEL_NAMES["text-generation"]
    prompt = "Acme was founded by John Smith in 1950 in the city of Springfield. " * 2
    body = {"model": model, "prompt": prompt, "max_tokens": 3, "temperature": 0}
    streamed = body | {"stream": True, "stream_options": {"include_usage": True}}
    with live_server(lm_repository) as server, httpx.Client(base_url=server.base_url, timeout=60) as client:
        first, again = (client.post("/v1/completions", json=body).json()["usage"] for _ in range(2))
        with client.stream("POST", "/v1/completions", json=streamed) as r:
            events = [line.removeprefix("data: ") for line in r.iter_lines() if line.startswith("data: {")]
        streamed_usage = json.loads(events[-1])["usage"]
    assert first["prompt_tokens_details"] == {"cached_tokens": 0}
    cached = again["prompt_tokens_details"]["cached_tokens"]
    assert cached > 0 and cached % 16 == 0 and cached < again["prompt_tokens"] == first["prompt_tokens"]
    assert streamed_usage["prompt_tokens_details"] == {"cached_tokens": cached}
