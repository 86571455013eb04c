"""Normal traffic's latency with thousands of slow or idle connections held open against the server.

    python -m benchmarks.slow_clients --repository models --connections 3000 --out docs/bench

An attacker process opens `--connections` connections to the service and holds them (OWASP API4):
- `trickle`: each sends a request's headers announcing a 100 kB body, then one byte every 2 s, at a phase
  of its own, and connects again whenever the server cuts it (the body timeout answers 408 and closes);
- `idle`: each connects and sends nothing, and connects again when cut (the header timeout).
Meanwhile wrk sends normal classify requests on 8 connections. Each round measures the same load without
the attacker and with each kind, on one fresh server; the figure is p99 with ÷ p99 without.

On one machine the attacker's own CPU is taken from the server's cores; `--attacker-nice 19` runs it at the
lowest priority, as an attacker on another host would cost the server nothing but its connections. Both are
worth a figure: say which one a number is.
"""

from __future__ import annotations

import asyncio
import functools
import json
import os
import random
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.console import Console

from benchmarks.servers import SERVER_PIDS, serve
from benchmarks.wrk_load import load
from common.cli import cli_app
from common.progress import ProgressLog
from loadtests.process_cpu import cpu_by_thread_name
from loadtests.texts import reviews

console = Console(stderr=True)
app = cli_app(help=__doc__)

KINDS = ("trickle", "idle")
TRICKLE_EVERY_S = 2.0
BODY_BYTES = 100_000


class _Held(asyncio.Protocol):
    """One held connection; `lost` resolves when the server closes it."""

    def __init__(self, lost: asyncio.Future[None]) -> None:
        self.lost = lost

    def connection_lost(self, exc: Exception | None) -> None:
        if not self.lost.done():
            self.lost.set_result(None)


async def _hold(host: str, port: int, kind: str, until: float, counts: dict[str, int]) -> None:
    """Keep one slow connection open until `until`, connecting again each time the server cuts it."""
    loop = asyncio.get_running_loop()
    await asyncio.sleep(random.uniform(0, TRICKLE_EVERY_S))  # each at a phase of its own
    while loop.time() < until:
        lost: asyncio.Future[None] = loop.create_future()
        try:
            transport, _ = await loop.create_connection(functools.partial(_Held, lost), host, port)
        except OSError:
            counts["refused"] += 1
            await asyncio.sleep(0.5)
            continue
        counts["connections"] += 1
        if kind == "trickle":
            transport.write(
                (
                    f"POST /v1/classify HTTP/1.1\r\nHost: {host}\r\nContent-Type: application/json\r\n"
                    f"Content-Length: {BODY_BYTES}\r\n\r\n"
                ).encode()
            )
        while not lost.done() and loop.time() < until:
            await asyncio.wait([lost], timeout=TRICKLE_EVERY_S)
            if kind == "trickle" and not lost.done():
                transport.write(b"x")
        transport.close()
        if loop.time() < until:
            counts["cut"] += 1


async def attack(base: str, kind: str, connections: int, seconds: float) -> dict[str, int]:
    """`connections` slow connections held for `seconds`; how many were made, cut by the server, refused."""
    host, port = base.removeprefix("http://").split(":")
    until = asyncio.get_running_loop().time() + seconds
    counts = {"connections": 0, "cut": 0, "refused": 0}
    await asyncio.gather(*(_hold(host, int(port), kind, until, counts) for _ in range(connections)))
    return counts


def _attacker(base: str, kind: str, connections: int, seconds: float, nice: int) -> subprocess.Popen[str]:
    code = (
        "import asyncio, json, sys; from benchmarks.slow_clients import attack; "
        "print(json.dumps(asyncio.run(attack(*sys.argv[1:3], int(sys.argv[3]), float(sys.argv[4])))))"
    )
    command = [sys.executable, "-c", code, base, kind, str(connections), str(seconds)]
    return subprocess.Popen(
        command, stdout=subprocess.PIPE, text=True, preexec_fn=(lambda: os.nice(nice)) if nice else None
    )


def measure(
    repository: Path, connections: int, seconds: int, ramp_s: float, nice: int, kinds: tuple[str, ...]
) -> dict[str, Any]:
    """One fresh server: normal load alone, then beside each kind of slow connections."""
    bodies = [json.dumps({"inputs": t, "model": "sentiment"}) for t in reviews(500, seed=2)]
    out: dict[str, Any] = {}
    with serve(repository, {"DISTILSERVE_FRONTENDS": "1"}) as base:
        load("warm-up", base, "/v1/classify", bodies, 8, 2)
        for kind in ("none", *kinds):
            attacker = None
            if kind != "none":
                attacker = _attacker(base, kind, connections, ramp_s + seconds + 2, nice)
                time.sleep(ramp_s)  # every connection open before the load starts
            pid = SERVER_PIDS[base]
            cpu_before = sum(cpu_by_thread_name(pid).values())
            result = load(kind, base, "/v1/classify", bodies, 8, seconds)
            server_cores = (sum(cpu_by_thread_name(pid).values()) - cpu_before) / seconds
            row: dict[str, Any] = {
                "p50_ms": result.p50_ms,
                "p99_ms": result.p99_ms,
                "rps": result.rps,
                "errors": result.errors,
                "server_cores": server_cores,
            }
            if attacker is not None:
                stdout, _ = attacker.communicate(timeout=60)
                row |= json.loads(stdout.strip().splitlines()[-1])
            out[kind] = row
    return out


def render(rounds: list[dict[str, Any]], connections: int, nice: int, kinds: tuple[str, ...]) -> str:
    where = "at the lowest priority (nice 19)" if nice >= 19 else f"at nice {nice}"
    lines = [
        f"# Normal classify load (wrk, 8 connections) beside {connections:,} slow connections",
        "",
        f"`python -m benchmarks.slow_clients`; the attacker ran on the same cores {where}.",
        "",
        "| round | slow connections | p50 ms | p99 ms | p99 ÷ without | req/s | errors | server cores "
        "| connections made / cut by the server |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for i, r in enumerate(rounds, 1):
        for kind in ("none", *kinds):
            row = r[kind]
            ratio = row["p99_ms"] / r["none"]["p99_ms"]
            made = "-" if kind == "none" else f"{row['connections']:,} / {row['cut']:,}"
            lines.append(
                f"| {i} | {kind} | {row['p50_ms']:.2f} | {row['p99_ms']:.2f} | {ratio:.2f}x "
                f"| {row['rps']:,.0f} | {row['errors']} | {row['server_cores']:.2f} | {made} |"
            )
    lines.append("")
    for kind in kinds:
        ratios = [r[kind]["p99_ms"] / r["none"]["p99_ms"] for r in rounds]
        lines.append(
            f"p99 with {kind} ÷ without, median of {len(rounds)}: **{statistics.median(ratios):.2f}x**"
        )
        lines.append("")
    return "\n".join(lines)


@app.command()
def run(
    repository: Annotated[Path, typer.Option(help="A repository with `sentiment` (make models).")] = Path(
        "models"
    ),
    connections: Annotated[int, typer.Option(min=1, help="Slow connections held open.")] = 3000,
    seconds: Annotated[int, typer.Option(min=1, help="Seconds of normal load per measurement.")] = 10,
    rounds: Annotated[int, typer.Option(min=1, help="Fresh servers, each measured without and with.")] = 2,
    ramp: Annotated[float, typer.Option(help="Seconds for the slow connections to open.")] = 5.0,
    attacker_nice: Annotated[int, typer.Option(help="The attacker's niceness (19: lowest priority).")] = 0,
    kind: Annotated[list[str], typer.Option(help="trickle and/or idle.")] = list(KINDS),  # noqa: B006
    out: Annotated[Path, typer.Option(help="Directory for slow_clients.md and .json.")] = Path("docs/bench"),
) -> None:
    """Measure normal traffic's latency without and with the slow connections, alternating."""
    unknown = sorted(set(kind) - set(KINDS))
    if unknown or not kind:
        raise typer.BadParameter(f"{', '.join(unknown) or 'none given'}; choose from {', '.join(KINDS)}")
    kinds = tuple(k for k in KINDS if k in kind)
    results = []
    with ProgressLog.beside(console, "slow clients", rounds, unit="rounds") as progress:
        for i in range(rounds):
            progress.update(status=f"round {i + 1}")
            results.append(measure(repository, connections, seconds, ramp, attacker_nice, kinds))
            progress.update(advance=1)
            console.print(f"  round {i + 1}: {results[-1]}")
    out.mkdir(parents=True, exist_ok=True)
    report = render(results, connections, attacker_nice, kinds)
    (out / "slow_clients.md").write_text(report)
    (out / "slow_clients.json").write_text(json.dumps({"attacker_nice": attacker_nice, "rounds": results}))
    console.print(report)


if __name__ == "__main__":
    app()
