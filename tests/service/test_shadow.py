"""service.shadow: which answers a teacher checks, and that a check never costs a client anything: none is
sent while clients are busy or too many are in flight, and one that fails or hangs counts as dropped."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from types import SimpleNamespace

import pytest
from prometheus_client import CollectorRegistry, Counter

from service import shadow
from service.shadow import SHADOW_BUSY, SHADOW_IN_FLIGHT, Checked, ShadowChecks, ShadowCounters


def counters() -> ShadowCounters:
    registry = CollectorRegistry()
    names = ("compared", "agreed", "dropped")
    return ShadowCounters(*(Counter(name, name, registry=registry) for name in names))


def count(counter: Counter) -> float:
    (family,) = counter.collect()
    return next(s.value for s in family.samples if s.name.endswith("_total"))


def checks(rate: float = 1.0) -> ShadowChecks:
    return ShadowChecks(SimpleNamespace(shadow_rate=rate))  # type: ignore[arg-type]


def test_the_rate_is_the_share_sampled() -> None:
    assert not any(checks(0.0).sampled() for _ in range(1000))
    assert all(checks(1.0).sampled() for _ in range(1000))
    picked = sum(checks(0.3).sampled() for _ in range(10_000))
    assert 2_700 < picked < 3_300  # 0.3 of 10,000 within 6.5 standard deviations


def test_a_check_is_counted_off_the_callers_path() -> None:
    async def scenario() -> None:
        c, done = counters(), asyncio.Event()

        async def check() -> Checked:
            await done.wait()
            return 3, 2.0

        s = checks()
        s.check_later(c, 3, check)  # returns at once: the check runs as its own task
        assert count(c.compared) == 0
        done.set()
        for _ in range(10):
            await asyncio.sleep(0)
        assert (count(c.compared), count(c.agreed), count(c.dropped)) == (3, 2, 0)

    asyncio.run(scenario())


def test_no_check_is_sent_while_clients_are_busy() -> None:
    async def scenario() -> None:
        c, called = counters(), []

        async def check() -> Checked:
            called.append(1)
            return 1, 1.0

        s = checks()
        contexts = [s.serving() for _ in range(SHADOW_BUSY + 1)]
        for context in contexts:
            context.__enter__()
        s.check_later(c, 2, check)
        assert count(c.dropped) == 2
        for context in contexts:
            context.__exit__(None, None, None)
        s.check_later(c, 1, check)  # quiet again: sent
        await asyncio.sleep(0.01)
        assert called == [1] and count(c.compared) == 1

    asyncio.run(scenario())


def test_past_the_in_flight_cap_checks_are_dropped_until_others_finish() -> None:
    async def scenario() -> None:
        c, release = counters(), asyncio.Event()

        def of(inputs: int) -> Callable[[], Awaitable[Checked]]:
            async def check() -> Checked:
                await release.wait()
                return inputs, 0.0

            return check

        s = checks()
        s.check_later(c, SHADOW_IN_FLIGHT, of(SHADOW_IN_FLIGHT))
        s.check_later(c, 1, of(1))  # one more input than the cap: dropped
        assert count(c.dropped) == 1
        release.set()
        await asyncio.sleep(0.01)
        assert count(c.compared) == SHADOW_IN_FLIGHT
        s.check_later(c, 1, of(1))  # room again
        await asyncio.sleep(0.01)
        assert count(c.dropped) == 1 and count(c.compared) == SHADOW_IN_FLIGHT + 1

    asyncio.run(scenario())


def test_a_failed_or_hung_check_counts_as_dropped_and_frees_its_room(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(shadow, "SHADOW_TIMEOUT_S", 0.05)

    async def scenario() -> None:
        c = counters()

        async def fails() -> Checked:
            raise RuntimeError("the teacher's queue is full")

        async def hangs() -> Checked:
            await asyncio.sleep(60)
            return 1, 1.0

        s = checks()
        s.check_later(c, SHADOW_IN_FLIGHT // 2, fails)
        s.check_later(c, SHADOW_IN_FLIGHT // 2, hangs)
        await asyncio.sleep(0.2)
        assert count(c.dropped) == SHADOW_IN_FLIGHT and count(c.compared) == 0

        async def fine() -> Checked:
            return SHADOW_IN_FLIGHT, float(SHADOW_IN_FLIGHT)

        s.check_later(c, SHADOW_IN_FLIGHT, fine)  # both freed their room
        await asyncio.sleep(0.01)
        assert count(c.compared) == SHADOW_IN_FLIGHT

    asyncio.run(scenario())
