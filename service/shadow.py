"""Live agreement: teachers check a sampled share of their students' answers, off the client's path.

A share (`DISTILSERVE_SHADOW_RATE`) of the inputs a student answered goes to its teacher too, after the
client has its answer, at the engine's lowest priority (service.batching: refused while a batch of client
work waits, dropped first when the queue is full), at most SHADOW_IN_FLIGHT inputs at a time per process,
and none while the process has more than SHADOW_BUSY client requests in flight (under load a check would
only be tokenized to be refused, and those that slip into an idle moment of the engine hold it when the next
client arrives: at 64 connections they cost the student's clients 8 % of their throughput and 40 % on p99
before this gate). What a check compares is its task's: the best answers of an encoder task
(service.cascade), the next tokens of a generation (service.tasks.generation_shadow), the vectors of an
embedding student (service.tasks.embedding_shadow), a query's best document (service.ranking). Here are
only the sampling, the gate and the counting, per pair (`ShadowCounters`): the live twin of the agreement
the distillation report measured offline, with an alert rule on it (deploy/prometheus/alerts.yml).
"""

from __future__ import annotations

import asyncio
import random
from collections.abc import Awaitable, Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

from service.settings import Settings

SHADOW_IN_FLIGHT = 64  # inputs a process has with teachers for shadow checks at once; beyond: dropped
SHADOW_BUSY = 4  # client requests in flight in this process beyond which no shadow check is sent
SHADOW_TIMEOUT_S = 5.0  # a shadow check not done within this long is dropped (and leaves the queue)
Checked = tuple[int, float]  # a shadow check's (inputs compared, agreed: a count, or a sum of cosines)


@dataclass(frozen=True)
class ShadowCounters:
    """One pair's shadow counters, resolved once (labels model, teacher)."""

    compared: Any  # distilserve_shadow_compared_total
    agreed: Any  # distilserve_shadow_agreed_total
    dropped: Any  # distilserve_shadow_dropped_total


class ShadowChecks:
    """The process's shadow checks: which answers are sampled, whether now is quiet enough, and the count."""

    def __init__(self, settings: Settings) -> None:
        self.settings = settings  # its shadow_rate: DISTILSERVE_SHADOW_RATE
        self._in_flight = 0  # inputs with teachers for checks now
        self._clients_in_flight = 0  # this process's client requests at a student's engine now
        self._tasks: set[asyncio.Task[None]] = set()  # referenced until done
        self._random = random.Random()

    def sampled(self) -> bool:
        """Whether one more student answer is checked."""
        rate = self.settings.shadow_rate
        return rate >= 1.0 or (rate > 0 and self._random.random() < rate)

    @contextmanager
    def serving(self) -> Iterator[None]:
        """Around a client's work for a student: checks wait for a quieter moment (SHADOW_BUSY)."""
        self._clients_in_flight += 1
        try:
            yield
        finally:
            self._clients_in_flight -= 1

    def check_later(
        self, counters: ShadowCounters, inputs: int, check: Callable[[], Awaitable[Checked]]
    ) -> None:
        """Run a teacher's check of `inputs` student answers off the client's path, within the limits above;
        `check` returns (compared, agreed). Refused, too late or failed, the inputs count as dropped, never
        as an error."""
        busy = self._clients_in_flight > SHADOW_BUSY  # other requests of this process at the engine
        if busy or self._in_flight + inputs > SHADOW_IN_FLIGHT:
            counters.dropped.inc(inputs)
            return
        self._in_flight += inputs
        task = asyncio.create_task(self._check(counters, inputs, check))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _check(
        self, counters: ShadowCounters, inputs: int, check: Callable[[], Awaitable[Checked]]
    ) -> None:
        try:
            compared, agreed = await asyncio.wait_for(check(), SHADOW_TIMEOUT_S)
        except Exception:  # refused under load, dropped for a client, too late: uncounted, never an error
            counters.dropped.inc(inputs)
            return
        finally:
            self._in_flight -= inputs
        counters.compared.inc(compared)
        counters.agreed.inc(agreed)
