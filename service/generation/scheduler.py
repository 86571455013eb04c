"""The scheduler decides: which waiting sequences join the running batch at this step, which leave.

Plain data in, a plan out; tested with fake runner outputs. Admission reserves each sequence's whole
capacity (prompt + max_new_tokens) against the cached-token budget, so a running sequence never runs out of
cache mid-generation and nothing has to be preempted.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass

from service.batch_policy import BatcherClosedError, QueueFullError
from service.generation.sequence import Sequence


@dataclass(frozen=True)
class SchedulerConfig:
    max_running: int = 16  # sequences decoded together (DISTILSERVE_GEN_MAX_BATCH)
    max_cached_tokens: int = 65536  # KV-cache positions reserved across running sequences
    max_waiting: int = 256  # beyond this, new requests get 429


@dataclass(frozen=True)
class StepPlan:
    prefill: list[Sequence]  # join now: their prompts run through the model together
    decode: list[Sequence]  # already running: one token each

    @property
    def empty(self) -> bool:
        return not self.prefill and not self.decode


class Scheduler:
    def __init__(self, config: SchedulerConfig) -> None:
        self.config = config
        self.waiting: deque[Sequence] = deque()
        self.running: list[Sequence] = []
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
        """Finished or abandoned sequences leave; waiting ones join in arrival order while budgets allow."""
        self.retire()
        self.waiting = deque(s for s in self.waiting if not s.aborted)
        decode = list(self.running)
        reserved = self.reserved_tokens()
        prefill: list[Sequence] = []
        while self.waiting and len(self.running) + len(prefill) < self.config.max_running:
            candidate = self.waiting[0]
            if reserved + candidate.capacity > self.config.max_cached_tokens:
                break  # first come, first served: no overtaking by smaller requests
            prefill.append(self.waiting.popleft())
            reserved += candidate.capacity
        self.running.extend(prefill)
        return StepPlan(prefill=prefill, decode=decode)
