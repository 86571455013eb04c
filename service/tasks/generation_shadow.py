"""Live agreement for a generation student: a sampled share of its finished answers (DISTILSERVE_SHADOW_RATE)
is read back by its teacher, off the client's path, within service.cascade's shadow limits.

The teacher reads the student's prompt and answer in one prefill (`prompt_logprobs`, one alternative), and
each token the student wrote is compared with the teacher's most likely token at that place: the unit of the
next-token agreement `eval-lm` writes into the student's distillation report, so the pair's live agreement
(`distilserve_shadow_agreed_total` / `distilserve_shadow_compared_total`, counted in tokens here) sits beside
the export-time figure and its alert rule. It is measured on the student's own answers, not on the eval
text: a student that drifts from its teacher where users take it shows here first.

Only plain greedy answers are checked: there each token is the student's own best, which the teacher's best
either is or is not. A sampled token is a draw, often neither model's best (the SmolLM2 pair: 0.236 on
sampled answers against 0.636 on greedy ones, docs/benchmarks.md), and a logit bias or a penalty moves
the student's choice off its distribution's best; counting them would set off the drift alert for nothing.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

from service.exchange import Exchange
from service.generation.sampling import Logprob, SamplingParams
from service.generation.sequence import Sequence
from service.tasks.generation_base import complete, prepare

if TYPE_CHECKING:
    from service.served import ServedModel
    from service.tasks.contract import Collaborators


def shadow_hook(c: Collaborators, model: ServedModel, x: Exchange) -> Callable[[Sequence], None] | None:
    """What a finished answer of `model` calls (Prepared.on_done), where it is a student that is checked."""
    pair = c.pairs.pair_of(model)
    if pair is None or c.settings.shadow_rate <= 0:
        return None

    def done(seq: Sequence) -> None:
        output, shadows = list(seq.output[: seq.streamed]), c.pairs.shadows
        if output and seq.params.argmax and shadows.sampled():
            prompt = list(seq.prompt)
            shadows.check_later(pair.shadow, 1, lambda: teacher_agreement(pair.teacher, prompt, output, c, x))

    return done


async def teacher_agreement(
    teacher: ServedModel, prompt: list[int], output: list[int], c: Collaborators, x: Exchange
) -> tuple[int, int]:
    """(tokens compared, tokens where the teacher's most likely next token is the student's)."""
    params = SamplingParams(max_new_tokens=1, prompt_logprobs=1)
    check = Exchange(limits=x.limits, shadow=True)
    prepared = prepare(teacher, prompt + output, params, False, c.metrics, check)
    scores: list[list[Logprob]] = []
    await complete(prepared, lambda event: scores.append(event.prompt_logprobs or []) if not scores else None)
    at_output = scores[0][len(prompt) - 1 :]  # entry i scores token i + 1 of prompt + output
    best = [alternatives[0][0] for _, alternatives in at_output]
    return len(output), sum(b == token for b, token in zip(best, output, strict=True))
