"""The slow-clients benchmark's attacker holds its connections as it says, and the server cuts them."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path

import pytest
from typer.testing import CliRunner

from benchmarks.slow_clients import app, attack, render
from tests.service.live_server import LiveServer, live_server

QUICK_CUTS = {
    "DISTILSERVE_HEADER_TIMEOUT_S": "1",
    "DISTILSERVE_BODY_TIMEOUT_S": "1",
    "DISTILSERVE_FRONTENDS": "1",
    "DISTILSERVE_WARMUP": "false",
}


@pytest.fixture(scope="module")
def server(tiny_repository: Path) -> Iterator[LiveServer]:
    with live_server(tiny_repository, QUICK_CUTS) as s:
        yield s


@pytest.mark.parametrize("kind", ["trickle", "idle"])
def test_slow_connections_are_held_until_cut_and_made_again(server: LiveServer, kind: str) -> None:
    counts = asyncio.run(attack(server.base_url, kind, connections=4, seconds=5.0))
    assert counts["refused"] == 0
    # Each is cut after ~1 s (a trickle never finishes its body; an idle one never sends headers) and
    # connects again: several connections each, every one but the last of each cut by the server.
    assert counts["cut"] >= 4 * 2
    assert counts["connections"] >= counts["cut"]


def test_the_report_gives_p99_with_over_without() -> None:
    row = {"p50_ms": 1.0, "rps": 100.0, "errors": 0, "server_cores": 1.0, "connections": 10, "cut": 5}
    rounds = [
        {"none": row | {"p99_ms": 2.0}, "trickle": row | {"p99_ms": 3.0}},
        {"none": row | {"p99_ms": 2.0}, "trickle": row | {"p99_ms": 5.0}},
    ]
    report = render(rounds, connections=3000, nice=19, kinds=("trickle",))
    assert "| 2 | trickle | 1.00 | 5.00 | 2.50x |" in report
    assert "median of 2: **2.00x**" in report
    assert "lowest priority" in report


def test_an_unknown_kind_is_refused_in_one_line() -> None:
    result = CliRunner().invoke(app, ["--kind", "trickel", "--rounds", "1"])
    assert result.exit_code == 2
    assert "trickel; choose from trickle, idle" in result.output
