"""How many threads a decoder's engine call runs on a CPU, decided by timing the candidates at start-up, and
how those threads wait (`thread_spinning`, DISTILSERVE_THREAD_SPINNING=auto).

A decode step of a small student is a few hundred microseconds of small operators; spread over two threads,
each operator also waits for the second thread (to wake, where DISTILSERVE_THREAD_SPINNING=off; to be
scheduled, where it spins on a busy machine), and the step can get slower. A big
model's operators are long enough to split. Where the line falls depends on the model and the machine, so
the engine core times one busy decode step with each candidate and keeps the faster. Measured on the 2-core
CPU (ONNX Runtime alone, past 48, ms a step at batch 1 / 16): the demo LM (int8) 0.15 / 0.36 on one thread
against 0.20 / 0.48 on two; SmolLM2's 10-layer student (fp32) 9.2 / 22.5 against 6.9 / 14.8.
Both sessions are alive while they are timed (for SmolLM2's fp32 teacher ~0.5 GB more, for a moment, at
start-up); the slower one is dropped before the core serves (and its memory handed back: service.memory).
A decoder whose step on all cores takes `SPLIT_PAYS_S` or more is not timed on one: building and timing the
second session cost SmolLM2's pair ~25 s of a 34 s start-up, to confirm what a step that long always shows.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Literal

from common.draft_head import DraftHead
from service.engine import Engine
from service.generation.runner import DecoderRunner
from service.generation.sampling import SamplingParams
from service.generation.scheduler import StepPlan
from service.generation.sequence import Sequence as GenSequence
from service.manifest import GenerationLayout, Manifest

# A busy (16-row) decode step this long on all cores is many long operators: splitting them pays (SmolLM2's
# 12-layer student 14.8 ms on 2 threads against 22.5 on 1, its teacher 42 against 64; the demo LM, which one
# thread serves faster, 0.48 against 0.36). Shorter ones are timed on both.
SPLIT_PAYS_S = 0.010


def decode_step_s(
    engine: Engine,
    layout: GenerationLayout,
    rows: int,
    prompt_tokens: int,
    steps: int = 8,
    head: DraftHead | None = None,
) -> float:
    """The fastest of `steps` decode steps of `rows` sequences after a `prompt_tokens`-token prefill (the
    first step, which sizes the cache, left out). The fastest, not the median: the engine core times this
    while its frontends start beside it, and other work only ever adds time. `head`: a draft's cut head,
    timed scoring the prompt's tokens as context (as it drafts)."""
    runner = DecoderRunner(engine, layout, head=head)
    seqs = [
        GenSequence(prompt=list(range(1, prompt_tokens + 1)), params=SamplingParams(max_new_tokens=steps + 2))
        for _ in range(rows)
    ]
    plan = StepPlan(prefill=seqs, decode=[])
    if head is not None:
        runner.context = head.context(s.prompt for s in seqs)
    times = []
    for _ in range(steps + 1):
        result = runner.execute(plan)
        for seq in seqs:
            seq.output.append(result.tokens[seq.id])
        if not plan.prefill:
            times.append(result.decode_s)
        plan = StepPlan(prefill=[], decode=seqs)
    return min(times[1:])


@dataclass(frozen=True)
class Timed:
    threads: int
    step_s: float


def fastest_threads(
    candidates: Sequence[tuple[int, Engine]], time_step: Callable[[Engine], float], rounds: int = 3
) -> list[Timed]:
    """Each candidate's best step time over `rounds` alternating rounds, fastest first."""
    best = {threads: float("inf") for threads, _ in candidates}
    for _ in range(rounds):  # alternating, so a burst of other work on the machine hits both
        for threads, engine in candidates:
            best[threads] = min(best[threads], time_step(engine))
    return sorted((Timed(t, s) for t, s in best.items()), key=lambda timed: timed.step_s)


def thread_spinning(manifests: list[Manifest]) -> Literal["run", "off"]:
    """What DISTILSERVE_THREAD_SPINNING=auto means for an engine core serving these models: threads that spin
    within a call where one decoder runs at a time (SmolLM2's teacher alone 1.21-1.27x the tokens/s at 1
    stream, drafted 1.17-1.22x), sleeping ones where several decoders may be busy at once (two of them,
    teacher and student each under load: 228-238 against 175-181 tokens/s with spinning). A student that
    drafts for a teacher served beside it runs on the teacher's engine thread, so it is counted with it."""
    decoders = {m.name: m for m in manifests if m.generation is not None}
    alone = [m for m in decoders.values() if m.teacher is None or m.teacher.name not in decoders]
    return "run" if len(alone) <= 1 else "off"
