"""The scheduler decides: which waiting sequences join the running batch at this step, which leave.

Plain data in, a plan out; tested with fake runner outputs. Admission reserves each sequence's whole
capacity (prompt + max_new_tokens) against the cached-token budget, so a running sequence never runs out of
cache mid-generation and nothing has to be preempted.

An admitted sequence is prefilling until its first token comes: the runner takes a long prompt through the
model a chunk a step while the others decode (runner.DecoderRunner._prefill), so the plan names the same
group of prompts step after step, less those done. Beside a group under way, newcomers join only if their
prompts go through in one call (a short request does not wait behind a long one); a longer one waits until
the group is through and starts the next.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable
from dataclasses import dataclass

from service.batch_policy import BatcherClosedError, QueueFullError
from service.generation.sequence import Sequence

PREFILL_TOKENS = 512  # positions (rows x columns) in one prefill call: DISTILSERVE_GEN_PREFILL_TOKENS


@dataclass(frozen=True)
class SchedulerConfig:
    max_running: int = 16  # sequences decoded together (DISTILSERVE_GEN_MAX_BATCH)
    prefill_tokens: int = PREFILL_TOKENS  # the runner's call budget: who can join beside a group under way
    max_cached_tokens: int = 65536  # KV-cache positions reserved across running sequences
    max_waiting: int = 256  # beyond this, new requests get 429


@dataclass(frozen=True)
class StepPlan:
    prefill: list[Sequence]  # prefilling: their prompts run through the model together (a chunk, or all)
    decode: list[Sequence]  # running with a first token: one token each

    @property
    def empty(self) -> bool:
        return not self.prefill and not self.decode


class Scheduler:
    def __init__(self, config: SchedulerConfig, cached: Callable[[list[int]], int] | None = None) -> None:
        """`cached`: how many of a prompt's first tokens the runner's prefix cache holds (they are not run,
        so they do not count against a prefill call's budget)."""
        self.config = config
        self.cached = cached or (lambda prompt: 0)
        self.waiting: deque[Sequence] = deque()
        self.running: list[Sequence] = []  # admitted: prefilling, then decoding
        self.prefilling: list[Sequence] = []  # of them, those whose first token is still to come
        self.closed = False

    def add(self, seq: Sequence) -> None:
        if self.closed:
            raise BatcherClosedError("the server is shutting down and takes no new work")
        if seq.capacity > self.config.max_cached_tokens:
            raise ValueError(
                f"prompt + max_new_tokens = {seq.capacity} tokens exceeds the cache budget of "
                f"{self.config.max_cached_tokens}"
            )
        if len(self.waiting) >= self.config.max_waiting:
            raise QueueFullError(retry_after_s=1.0)
        self.waiting.append(seq)

    @property
    def has_work(self) -> bool:
        return bool(self.waiting) or bool(self.running)

    def reserved_tokens(self) -> int:
        return sum(s.capacity for s in self.running)

    def retire(self) -> None:
        """Finished or abandoned sequences leave the running batch (and free their reservation)."""
        self.running = [s for s in self.running if not s.done]

    def schedule(self) -> StepPlan:
        """Finished or abandoned sequences leave; the prompts under way go on, and once they are through,
        waiting ones join in arrival order while budgets allow."""
        self.retire()
        self.waiting = deque(s for s in self.waiting if not s.aborted)
        self.prefilling = [s for s in self.prefilling if not s.output and not s.done]
        under_way = {s.id for s in self.prefilling}
        decode = [s for s in self.running if s.id not in under_way]
        self.prefilling += self._admit(one_call=bool(self.prefilling))
        return StepPlan(prefill=list(self.prefilling), decode=decode)

    def _admit(self, one_call: bool) -> list[Sequence]:
        """Waiting sequences that join now, in arrival order while the budgets allow; `one_call`: only
        while their prompts together go through in one prefill call (beside a group under way)."""
        reserved = self.reserved_tokens()
        joining: list[Sequence] = []
        while self.waiting and len(self.running) + len(joining) < self.config.max_running:
            candidate = self.waiting[0]
            if reserved + candidate.capacity > self.config.max_cached_tokens:
                break  # first come, first served: no overtaking by smaller requests
            group = [*joining, candidate]
            if one_call and max(self._to_run(s) for s in group) * len(group) > self.config.prefill_tokens:
                break  # the rest wait for the group under way, in arrival order
            joining.append(self.waiting.popleft())
            reserved += candidate.capacity
        self.running.extend(joining)
        return joining

    def _to_run(self, seq: Sequence) -> int:
        """The prompt positions its prefill runs: the prompt's, less those the prefix cache holds."""
        return len(seq.prompt) - self.cached(seq.prompt)
