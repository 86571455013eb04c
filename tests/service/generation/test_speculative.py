"""Speculative decoding: the student drafts, the teacher checks; greedy text is the teacher's own, and the
sampling rule keeps the teacher's distribution."""

from __future__ import annotations

import json
import logging
import shutil
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from fastapi.testclient import TestClient

from service.app import create_app
from service.engine import Engine
from service.generation.runner import DecoderRunner, StepResult
from service.generation.sampling import SamplingParams
from service.generation.scheduler import Scheduler, SchedulerConfig, StepPlan
from service.generation.sequence import Sequence
from service.generation.slot_cache import LayerCache
from service.generation.speculative import SpeculativeRunner, accept, distribution
from service.manifest import GenerationLayout
from service.repository import scan_repository
from service.runtime import ort_engine_factory
from service.settings import Settings
from tests.service.test_app import metric_value
from tests.tiny_models import export_lm_pair

Loaded = dict[str, tuple[Engine, GenerationLayout]]


@pytest.fixture(scope="module")
def lm_pair(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A tiny GPT-2 teacher (`lm-teacher`) and a student of another seed paired with it (`lm`)."""
    return export_lm_pair(tmp_path_factory.mktemp("lm-pair"))[0]


@pytest.fixture(scope="module")
def loaded(lm_pair: Path) -> Loaded:
    versions = {v.manifest.name: v for v in scan_repository(lm_pair).versions}
    out: Loaded = {}
    for name, version in versions.items():
        assert version.manifest.generation is not None
        out[name] = (ort_engine_factory(version, "fp32", Settings()), version.manifest.generation)
    return out


def generate(
    runner: DecoderRunner | SpeculativeRunner,
    requests: list[tuple[int, list[int], int]],
    penalty: float = 1.0,
    before_step: Callable[[int], None] | None = None,
    results: list[StepResult] | None = None,
) -> list[list[int]]:
    """Continuous batching by hand: request i joins at step `arrival`, leaves after its max_new_tokens.
    `before_step(step)` runs before each step; `results` receives each step's result."""
    params = [SamplingParams(max_new_tokens=n, repetition_penalty=penalty) for _, _, n in requests]
    seqs = [Sequence(prompt=p, params=q) for (_, p, _), q in zip(requests, params, strict=True)]
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


def test_greedy_with_a_repetition_penalty_is_the_teachers_own_too(loaded: Loaded) -> None:
    alone = generate(DecoderRunner(*loaded["lm-teacher"]), REQUESTS, penalty=1.3)
    speculative = SpeculativeRunner(DecoderRunner(*loaded["lm-teacher"]), DecoderRunner(*loaded["lm"]), 3, 64)
    assert generate(speculative, REQUESTS, penalty=1.3) == alone


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


class CountingRunner(DecoderRunner):
    """A draft that counts its decode passes (engine calls after a past) and the tokens each one took."""

    def __init__(self, engine: Engine, layout: GenerationLayout) -> None:
        super().__init__(engine, layout)
        self.widths: list[int] = []

    def run_step(
        self, input_ids: np.ndarray, mask: np.ndarray, positions: np.ndarray, past: list[LayerCache]
    ) -> dict[str, Any]:
        self.widths.append(int(input_ids.shape[1]))
        return super().run_step(input_ids, mask, positions, past)


@pytest.mark.parametrize("draft", ["lm", "lm-teacher"], ids=["student-draft", "teacher-as-its-own-draft"])
def test_a_round_of_k_drafts_costs_k_draft_passes(loaded: Loaded, draft: str) -> None:
    """No pass feeds the k-th draft only to cache it: a row that kept all k drafts has it fed with the
    teacher's next token in the next round's first pass (two tokens wide; otherwise one)."""
    counting = CountingRunner(*loaded[draft])
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


def chi_square(counts: np.ndarray, probabilities: np.ndarray) -> float:
    expected = counts.sum() * probabilities
    keep = expected > 0
    assert counts[~keep].sum() == 0  # nothing where the teacher puts no mass
    return float(((counts[keep] - expected[keep]) ** 2 / expected[keep]).sum())


def test_the_sampling_rule_keeps_the_teachers_distribution() -> None:
    """Drafts drawn from q, kept or replaced by the rule: the emitted tokens follow p, the teacher's, at
    the first position and (given two emitted) at the second; a chi-square test on a 6-token vocabulary."""
    rng = np.random.default_rng(0)
    vocab, trials = 6, 40_000
    p = [rng.dirichlet(np.ones(vocab)) for _ in range(3)]
    q = [rng.dirichlet(np.ones(vocab)) for _ in range(2)]
    q[1][3] = 0.0  # the draft never proposes a token the teacher may want: the residual must supply it
    q[1] /= q[1].sum()
    first, second = np.zeros(vocab), np.zeros(vocab)
    for _ in range(trials):
        drafts = [int(rng.choice(vocab, p=q[0])), int(rng.choice(vocab, p=q[1]))]
        emitted = accept(drafts, q, p, rng)
        first[emitted[0]] += 1
        if len(emitted) >= 2:
            second[emitted[1]] += 1
    critical = 20.52  # chi-square, 5 degrees of freedom, p = 0.001
    assert chi_square(first, p[0]) < critical
    assert chi_square(second, p[1]) < critical
    # and the rule is not vacuous: a draft that differs from the teacher is sometimes refused
    assert second.sum() < trials


def test_distribution_is_what_the_sampler_draws_from() -> None:
    logits = np.array([2.0, 1.0, 0.5, -1.0, 3.0], dtype=np.float32)
    greedy = distribution(logits, SamplingParams(), [])
    assert greedy.tolist() == [0, 0, 0, 0, 1]
    top2 = distribution(logits, SamplingParams(temperature=1.0, top_k=2), [])
    e = np.exp([3.0, 2.0])
    np.testing.assert_allclose(top2[[4, 0]], e / e.sum())
    assert top2[[1, 2, 3]].sum() == 0
    full = distribution(logits, SamplingParams(temperature=0.5), [])
    w = np.exp((logits - logits.max()) / 0.5)
    np.testing.assert_allclose(full, w / w.sum(), rtol=1e-6)


@pytest.fixture(scope="module")
def served(lm_pair: Path) -> Iterator[tuple[TestClient, TestClient]]:
    on = Settings(model_repository=lm_pair, speculative="on", speculative_tokens=3)
    off = Settings(model_repository=lm_pair, speculative="off")
    with TestClient(create_app(on)) as fast, TestClient(create_app(off)) as plain:
        yield fast, plain


def test_clients_see_the_teachers_text_and_the_metrics_say_what_the_drafts_bought(
    served: tuple[TestClient, TestClient],
) -> None:
    fast, plain = served
    for prompt in ("Acme was founded", "I loved this film", "Who"):
        body = {"model": "lm-teacher", "prompt": prompt, "max_new_tokens": 16}
        a, b = fast.post("/v1/generate", json=body), plain.post("/v1/generate", json=body)
        assert a.status_code == b.status_code == 200
        assert a.json()["generated_text"] == b.json()["generated_text"]
        completion = {"model": "lm-teacher", "prompt": prompt, "max_tokens": 8, "temperature": 0}
        c, d = fast.post("/v1/completions", json=completion), plain.post("/v1/completions", json=completion)
        assert c.json()["choices"][0]["text"] == d.json()["choices"][0]["text"]
    metrics = fast.get("/metrics").text
    drafted = metric_value(metrics, "distilserve_draft_tokens_total", model="lm-teacher")
    checks = metric_value(metrics, "distilserve_speculative_checks_total", model="lm-teacher")
    assert drafted > 0 and checks > 0
    assert metric_value(plain.get("/metrics").text, "distilserve_draft_tokens_total") == 0


def test_log_probabilities_are_the_teachers_own_under_drafting(served: tuple[TestClient, TestClient]) -> None:
    """Drafted tokens' log-probabilities come from the teacher's checking pass: the same as decoding alone."""
    fast, plain = served
    body = {
        "model": "lm-teacher",
        "prompt": "Acme was founded",
        "max_tokens": 12,
        "temperature": 0,
        "logprobs": 2,
    }
    a = fast.post("/v1/completions", json=body).json()["choices"][0]["logprobs"]
    b = plain.post("/v1/completions", json=body).json()["choices"][0]["logprobs"]
    assert a["tokens"] == b["tokens"] and len(a["tokens"]) == 12
    assert a["token_logprobs"] == pytest.approx(b["token_logprobs"], abs=1e-5)
    for mine, theirs in zip(a["top_logprobs"], b["top_logprobs"], strict=True):
        assert mine.keys() == theirs.keys() and list(mine.values()) == pytest.approx(
            list(theirs.values()), abs=1e-5
        )


def test_auto_leaves_a_draft_as_costly_as_its_teacher_off(
    lm_pair: Path, caplog: pytest.LogCaptureFixture
) -> None:
    import logging

    caplog.set_level(logging.INFO)
    with TestClient(create_app(Settings(model_repository=lm_pair))) as c:
        body = {"model": "lm-teacher", "prompt": "Acme", "max_new_tokens": 4}
        assert c.post("/v1/generate", json=body).status_code == 200
        assert metric_value(c.get("/metrics").text, "distilserve_draft_tokens_total") == 0
    assert "speculative decoding off" in caplog.text  # the two tiny models are the same size


def stage_version_2(repository: Path, name: str, teacher_version: int | None = None) -> None:
    """Version 1 of `name` copied in as version 2 the way an export lands (renamed in whole); a student's
    manifest naming `teacher_version` of its teacher when given."""
    staging = repository / name / ".staging"
    shutil.copytree(repository / name / "1", staging)
    manifest = json.loads((staging / "manifest.json").read_text())
    manifest["version"] = 2
    if manifest.get("teacher") and teacher_version is not None:
        manifest["teacher"]["version"] = teacher_version
    (staging / "manifest.json").write_text(json.dumps(manifest))
    staging.rename(repository / name / "2")


def wait_for_served(client: TestClient, served: dict[str, int]) -> None:
    deadline = time.monotonic() + 30
    while {m["name"]: m["version"] for m in client.get("/v1/models").json()["models"]} != served:
        assert time.monotonic() < deadline, client.post("/v2/repository/index").json()
        time.sleep(0.05)


def teacher_drafted(client: TestClient) -> float:
    """Drafted tokens so far, after one more teacher request (which must succeed)."""
    body = {"model": "lm-teacher", "prompt": "Acme was founded", "max_new_tokens": 8}
    assert client.post("/v1/generate", json=body).status_code == 200
    return metric_value(client.get("/metrics").text, "distilserve_draft_tokens_total", model="lm-teacher")


def polled(lm_pair: Path, tmp_path: Path) -> tuple[Path, Settings]:
    repository = tmp_path / "models"
    shutil.copytree(lm_pair, repository)
    return repository, Settings(
        model_repository=repository, model_control="poll", repository_poll_s=0.1, speculative="on"
    )


def test_a_pair_exported_while_serving_drafts_too(lm_pair: Path, tmp_path: Path) -> None:
    """Under model control, a new teacher version loaded beside its new student gets the student as its
    draft before it starts (a teacher already decoding is never given one under its engine thread)."""
    repository, settings = polled(lm_pair, tmp_path)
    with TestClient(create_app(settings)) as c:
        for name in ("lm", "lm-teacher"):  # the pair, version 2 of both, the student naming teacher 2
            stage_version_2(repository, name, teacher_version=2)
        wait_for_served(c, {"lm": 2, "lm-teacher": 2})
        assert teacher_drafted(c) > 0


def test_a_serving_teacher_drafts_with_its_students_new_version_and_alone_once_it_is_gone(
    lm_pair: Path, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="service.drafts")
    repository, settings = polled(lm_pair, tmp_path)
    with TestClient(create_app(settings)) as c:
        assert teacher_drafted(c) > 0  # drafting with lm v1
        stage_version_2(repository, "lm")  # the student's next version, for the same teacher
        wait_for_served(c, {"lm": 2, "lm-teacher": 1})
        assert "lm v2 drafts for lm-teacher from its next step" in caplog.text
        assert "lm v1 gone" not in caplog.text  # its successor had already taken over
        before = teacher_drafted(c)
        assert teacher_drafted(c) > before  # v2 drafts

        shutil.rmtree(repository / "lm")  # the student removed: the teacher goes on alone
        wait_for_served(c, {"lm-teacher": 1})
        assert "lm v2 gone, lm-teacher decodes alone" in caplog.text
        before = teacher_drafted(c)
        assert teacher_drafted(c) == before


@pytest.fixture(scope="module")
def drafting_pair(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The tiny pair with the student's draft variant beside its fp32 (export.variants.build_draft)."""
    return export_lm_pair(tmp_path_factory.mktemp("lm-draft-pair"), student_variants=("fp32", "draft"))[0]


@pytest.mark.parametrize("draft", ["auto", "served"])
def test_a_students_draft_variant_drafts_and_the_text_stays_the_teachers(
    drafting_pair: Path, draft: str, caplog: pytest.LogCaptureFixture
) -> None:
    """The draft variant only drafts: the student still answers in fp32, and the teacher's greedy text is
    its own whichever session drafted."""
    caplog.set_level(logging.INFO, logger="service.drafts")
    on = Settings(
        model_repository=drafting_pair, speculative="on", speculative_tokens=3, speculative_draft=draft
    )
    off = Settings(model_repository=drafting_pair, speculative="off")
    with TestClient(create_app(on)) as fast, TestClient(create_app(off)) as plain:
        for prompt in ("Acme was founded", "I loved this film", "Who"):
            body = {"model": "lm-teacher", "prompt": prompt, "max_new_tokens": 16}
            a, b = fast.post("/v1/generate", json=body), plain.post("/v1/generate", json=body)
            assert a.status_code == b.status_code == 200
            assert a.json()["generated_text"] == b.json()["generated_text"]
        metrics = fast.get("/metrics").text
        assert metric_value(metrics, "distilserve_draft_tokens_total", model="lm-teacher") > 0
        student = next(m for m in fast.get("/v1/models").json()["models"] if m["name"] == "lm")
        assert student["variant"] == "fp32" and "draft" in student["variants"]
    drafted_with = "its draft variant" if draft == "auto" else "fp32"
    assert f"speculative decoding: lm ({drafted_with}) drafts for lm-teacher" in caplog.text


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
