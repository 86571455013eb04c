"""The runners' step: a joining prompt's first token handed out before the running rows' step runs."""

from __future__ import annotations

import pytest

from common.logit_positions import LOGIT_POSITIONS
from service.generation.runner import DecoderRunner, StepLogprobs
from service.generation.sampling import SamplingParams
from service.generation.scheduler import StepPlan
from service.generation.sequence import Sequence
from service.generation.speculative import SpeculativeRunner
from tests.service.generation.conftest import Loaded
from tests.service.generation.helpers import CallLog


@pytest.mark.parametrize("drafting", [False, True], ids=["teacher-alone", "drafted"])
def test_a_joining_prompts_first_token_is_handed_out_before_the_running_rows_step(
    loaded: Loaded, drafting: bool
) -> None:
    """Beside a decoding sequence, a newcomer's first token goes to `first_tokens` once its prefill call is
    done, before any call of the running rows' step (a plain decode, or drafting and checking); a step
    with nothing decoding hands it out in its result alone."""
    teacher_engine, layout = loaded["lm-teacher"]
    teacher, draft = CallLog(teacher_engine), CallLog(loaded["lm"][0])
    runner: DecoderRunner | SpeculativeRunner = DecoderRunner(teacher, layout)  # type: ignore[arg-type]
    if drafting:
        runner = SpeculativeRunner(runner, DecoderRunner(draft, loaded["lm"][1]), 3, 64)  # type: ignore[arg-type]
    handed: list[tuple[dict[int, int], int, int]] = []

    def first_tokens(tokens: dict[int, int], logprobs: StepLogprobs) -> None:
        handed.append((dict(tokens), len(teacher.widths), len(draft.widths)))

    seq = Sequence(prompt=[5, 9, 13], params=SamplingParams(max_new_tokens=20))
    seq.output.append(runner.execute(StepPlan(prefill=[seq], decode=[]), first_tokens).tokens[seq.id])
    assert handed == []  # nothing else ran in that step: the result is as soon
    seq.output.append(runner.execute(StepPlan(prefill=[], decode=[seq]), first_tokens).tokens[seq.id])
    teacher.widths.clear()
    draft.widths.clear()

    joining = Sequence(prompt=[7, 7, 7, 2], params=SamplingParams(max_new_tokens=4))
    result = runner.execute(StepPlan(prefill=[joining], decode=[seq]), first_tokens)
    assert handed == [({joining.id: result.tokens[joining.id]}, 1, 0)]  # after the teacher's prefill only
    assert teacher.widths[0] == 4 and len(teacher.widths) == 2  # the prefill, then the step's check
    assert (len(draft.widths) > 0) == drafting and (result.drafted > 0) == drafting


def test_each_call_scores_only_the_positions_it_uses(loaded: Loaded) -> None:
    """A prefill asks the graph for each prompt's last position alone (right-padded prompts end in
    different columns), with the first tokens and their log-probabilities of a prefill scoring every
    position; prompt log-probabilities ask for every one. Drafting asks for the last position, the
    teacher's check of k drafts for all k + 1."""
    teacher_engine, layout = loaded["lm-teacher"]
    teacher, draft = CallLog(teacher_engine), CallLog(loaded["lm"][0])
    assert LOGIT_POSITIONS in teacher.input_names
    prompts = [[5, 9, 13, 2], [7], [4, 4, 8, 15, 16, 23]]

    def first_tokens(params: SamplingParams) -> tuple[dict[int, int], StepLogprobs]:
        seqs = [Sequence(prompt, params, id=i) for i, prompt in enumerate(prompts)]
        logprobs = StepLogprobs()
        return DecoderRunner(teacher, layout).prefill(seqs, logprobs=logprobs), logprobs  # type: ignore[arg-type]

    picked, picked_logprobs = first_tokens(SamplingParams(max_new_tokens=4, logprobs=1))
    assert teacher.picked[-1].tolist() == [[3], [0], [5]]
    every, every_logprobs = first_tokens(SamplingParams(max_new_tokens=4, logprobs=1, prompt_logprobs=1))
    assert teacher.picked[-1].tolist() == [list(range(6))] * 3
    assert picked == every
    for i in range(len(prompts)):
        assert picked_logprobs.tokens[i][0][0] == pytest.approx(every_logprobs.tokens[i][0][0], abs=1e-5)

    runner = SpeculativeRunner(
        DecoderRunner(teacher, layout),  # type: ignore[arg-type]
        DecoderRunner(draft, loaded["lm"][1]),  # type: ignore[arg-type]
        3,
        64,
    )
    seq = Sequence(prompt=prompts[2], params=SamplingParams(max_new_tokens=20))
    seq.output.append(runner.execute(StepPlan(prefill=[seq], decode=[])).tokens[seq.id])
    teacher.picked.clear()
    draft.picked.clear()
    result = runner.execute(StepPlan(prefill=[], decode=[seq]))
    assert result.drafted == 3
    # the draft's catch-up prefill of the context, then a pass a draft: the last position's logits alone
    assert [p.tolist() for p in draft.picked] == [[[w - 1]] for w in draft.widths]
    assert draft.widths == [len(prompts[2]), 1, 1, 1]
    assert [p.tolist() for p in teacher.picked] == [[[0, 1, 2, 3]]]
