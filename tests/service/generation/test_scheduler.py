"""The scheduler with plain sequences and fake runner outputs: joins, leaves, budgets, bounds."""

from __future__ import annotations

import pytest

from service.batch_policy import BatcherClosedError, QueueFullError
from service.generation.sampling import SamplingParams
from service.generation.scheduler import Scheduler, SchedulerConfig
from service.generation.sequence import Sequence


def seq(prompt_len: int, max_new: int = 4) -> Sequence:
    return Sequence(prompt=list(range(1, prompt_len + 1)), params=SamplingParams(max_new_tokens=max_new))


def test_waiting_sequences_join_between_steps_up_to_the_running_cap() -> None:
    s = Scheduler(SchedulerConfig(max_running=2))
    a, b, c = seq(3), seq(5), seq(2)
    for x in (a, b, c):
        s.add(x)
    plan = s.schedule()
    assert plan.prefill == [a, b] and plan.decode == []
    a.output.append(7)
    b.output.append(7)
    plan = s.schedule()
    assert plan.prefill == [] and plan.decode == [a, b]  # c waits: the batch is full
    a.finish_reason = "eos"
    plan = s.schedule()
    assert plan.prefill == [c] and plan.decode == [b]  # a left the step it finished; c took its slot


def test_admission_reserves_whole_capacity_and_keeps_arrival_order() -> None:
    s = Scheduler(SchedulerConfig(max_running=8, max_cached_tokens=20))
    big, small = seq(10, 8), seq(1, 1)  # capacities 18 and 2
    first = seq(2, 2)  # capacity 4
    for x in (first, big, small):
        s.add(x)
    plan = s.schedule()
    assert plan.prefill == [first]  # big does not fit beside first (4 + 18 > 20); small may not overtake it
    first.finish_reason = "length"
    assert s.schedule().prefill == [big, small]
    assert s.reserved_tokens() == 20


def test_aborted_sequences_free_their_slot_at_the_next_step() -> None:
    s = Scheduler(SchedulerConfig(max_running=1))
    a, b = seq(3), seq(3)
    s.add(a)
    s.add(b)
    assert s.schedule().prefill == [a]
    a.aborted = True
    plan = s.schedule()
    assert plan.prefill == [b] and a not in s.running
    waiting = seq(2)
    s.add(waiting)
    waiting.aborted = True
    b.finish_reason = "eos"
    assert s.schedule().empty and not s.has_work


def test_bounds_refuse_instead_of_growing() -> None:
    s = Scheduler(SchedulerConfig(max_waiting=1, max_cached_tokens=10))
    s.add(seq(2))
    with pytest.raises(QueueFullError):
        s.add(seq(2))
    with pytest.raises(ValueError, match="exceeds the cache budget"):
        s.add(seq(8, 8))
    s.closed = True
    with pytest.raises(BatcherClosedError):
        s.add(seq(1))


def test_a_prompt_under_way_stays_in_the_plan_and_only_short_ones_join_beside_it() -> None:
    """A sequence is prefilling until its first token comes (a long prompt takes several steps): the plan
    names it again, not as decoding. Beside it newcomers join whose prompts go through in one call; a longer
    one waits, and those after it too (arrival order), until the prompts under way are through."""
    s = Scheduler(SchedulerConfig(max_running=8, prefill_tokens=16))
    short, long = seq(3), seq(900)
    s.add(short)
    s.add(long)
    assert s.schedule().prefill == [short, long]
    short.output.append(7)  # its prompt ended in the first chunk; the long one goes on
    quick, slow, after = seq(8), seq(17), seq(2)
    for x in (quick, slow, after):
        s.add(x)
    plan = s.schedule()
    assert plan.prefill == [long, quick] and plan.decode == [short]  # 8 fits a call of 16; 17 never does
    quick.output.append(7)
    plan = s.schedule()
    assert plan.prefill == [long] and plan.decode == [short, quick]  # slow waits; `after` behind it
    long.output.append(7)
    plan = s.schedule()
    assert plan.prefill == [slow, after] and plan.decode == [short, long, quick]
    after.aborted = True  # gone part-way through its prefill: out of the plan, its slot freed
    plan = s.schedule()
    assert plan.prefill == [slow] and after not in s.running


def test_a_prompt_whose_start_is_cached_counts_only_the_rest_against_the_call() -> None:
    """Beside a prompt under way, a newcomer joins where the tokens its prefill runs fit one call: its
    prompt's, less those the runner's prefix cache holds (a shared preamble), not the whole prompt."""
    preamble = list(range(1000, 1032))

    def cached(prompt: list[int]) -> int:
        return 32 if prompt[:32] == preamble else 0

    plain = Scheduler(SchedulerConfig(prefill_tokens=16))
    with_cache = Scheduler(SchedulerConfig(prefill_tokens=16), cached=cached)
    for s in (plain, with_cache):
        long = seq(900)
        s.add(long)
        assert s.schedule().prefill == [long]
        asked = [
            Sequence(prompt=[*preamble, 5 + i], params=SamplingParams(max_new_tokens=4)) for i in range(3)
        ]
        for x in asked:
            s.add(x)
        joined = s.schedule().prefill
        assert joined == ([long] if s is plain else [long, *asked])  # 1 token each to run: 3 fit a call of 16
