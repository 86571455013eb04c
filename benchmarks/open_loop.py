"""Batching settings under an open-loop load: requests arrive at a fixed rate (Poisson), whatever the server
does, so queueing and batching decide latency (a closed loop like wrk fixes mean latency at connections ÷
throughput, whatever the batching).

    python -m benchmarks.open_loop --repository build/cold-minilm --model minilm-shaped --rate 400 \\
        --settings 32:0,32:2,target:60 --out docs/bench

Each setting gets a fresh server: `B:W` is max_batch_size B and max_wait_ms W, `target:T` is
DISTILSERVE_LATENCY_TARGET_MS=T. The client keeps up to `--connections` keep-alive connections; a request that
finds all of them busy opens no new one and waits for the first free (its wait counts in its latency, as a
real client's would). The client runs on the same cores as the server: say so beside a figure.
"""

from __future__ import annotations

import asyncio
import json
import random
import statistics
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated

import typer

from benchmarks.servers import serve
from common.cli import cli_app
from loadtests.texts import reviews

app = cli_app(help=__doc__)


async def http_exchange(
    reader: asyncio.StreamReader, writer: asyncio.StreamWriter, raw: bytes
) -> tuple[int, bytes]:
    """One request on a keep-alive connection, written raw: the answer's status and body (a client's own
    cost kept to a minimum, as it shares the cores with the server)."""
    writer.write(raw)
    status_line = await reader.readline()
    length = 0
    while (line := await reader.readline()) not in (b"\r\n", b""):
        if line.lower().startswith(b"content-length:"):
            length = int(line.split(b":", 1)[1])
    return int(status_line.split()[1]), await reader.readexactly(length)


def raw_post(host: str, path: str, body: str) -> bytes:
    return (
        f"POST {path} HTTP/1.1\r\nHost: {host}\r\nContent-Type: application/json\r\n"
        f"Content-Length: {len(body.encode())}\r\n\r\n{body}"
    ).encode()


@dataclass(frozen=True)
class Reply:
    """One request of an open-loop run: which of the bodies it sent, its status, its answer, its latency."""

    body: int
    status: int  # 0: the connection failed
    answer: bytes
    latency_s: float


async def _open_loop(
    host: str,
    port: int,
    raws: list[bytes],
    rate: float,
    seconds: float,
    connections: int,
    replies: list[Reply] | None = None,
) -> dict[str, float]:
    """`replies`: where each request's `Reply` goes, when the caller reads the answers."""
    pool: asyncio.Queue[tuple[asyncio.StreamReader, asyncio.StreamWriter]] = asyncio.Queue()
    for _ in range(connections):
        pool.put_nowait(await asyncio.open_connection(host, port))
    latencies: list[float] = []
    errors = 0
    rng = random.Random(0)

    async def one(index: int, due: float) -> None:
        nonlocal errors
        connection = await pool.get()
        status, answer = 0, b""
        try:
            for attempt in range(2):  # a keep-alive connection closed while idle (uvicorn: after 5 s) is
                try:  # opened again and the request sent once more, as HTTP clients do
                    status, answer = await http_exchange(*connection, raws[index])
                    break
                except (OSError, asyncio.IncompleteReadError, ValueError, IndexError):
                    connection[1].close()
                    connection = await asyncio.open_connection(host, port)
                    if attempt:
                        raise
            errors += status != 200
        except (OSError, asyncio.IncompleteReadError, ValueError, IndexError):
            errors += 1
        finally:
            pool.put_nowait(connection)
        latencies.append(time.perf_counter() - due)
        if replies is not None:
            replies.append(Reply(index, status, answer, latencies[-1]))

    started = time.perf_counter()
    due, tasks = started, []
    while due < started + seconds:
        due += rng.expovariate(rate)
        delay = due - time.perf_counter()
        if delay > 0:
            await asyncio.sleep(delay)
        tasks.append(asyncio.create_task(one(rng.randrange(len(raws)), due)))
    await asyncio.gather(*tasks)
    wall = time.perf_counter() - started
    while not pool.empty():  # closed here: left to the garbage collector, they stay open on the server
        pool.get_nowait()[1].close()
    return {
        "offered_rps": len(tasks) / seconds,
        "served_rps": len(tasks) / wall,
        **latency_ms(latencies),
        "errors": errors,
    }


def latency_ms(latencies_s: list[float]) -> dict[str, float]:
    """p50 and p99 of latencies in seconds, in ms (p99: the value 99 % of them do not exceed)."""
    ordered = sorted(latencies_s)
    if not ordered:
        return {"p50_ms": float("nan"), "p99_ms": float("nan")}
    return {
        "p50_ms": 1000 * statistics.median(ordered),
        "p99_ms": 1000 * ordered[min(len(ordered) - 1, int(0.99 * len(ordered)))],
    }


def open_loop(
    base: str,
    path: str,
    bodies: list[str],
    rate: float,
    seconds: float,
    connections: int,
    replies: list[Reply] | None = None,
) -> dict[str, float]:
    host, port = base.removeprefix("http://").split(":")
    raws = [raw_post(host, path, body) for body in bodies]
    return asyncio.run(_open_loop(host, int(port), raws, rate, seconds, connections, replies))


def _env(setting: str) -> dict[str, str]:
    if setting.startswith("target:"):
        return {"DISTILSERVE_LATENCY_TARGET_MS": setting.split(":", 1)[1]}
    size, wait = setting.split(":")
    return {"DISTILSERVE_MAX_BATCH_SIZE": size, "DISTILSERVE_MAX_WAIT_MS": wait}


@app.command()
def main(
    repository: Annotated[Path, typer.Option()],
    model: Annotated[str, typer.Option()],
    rate: Annotated[float, typer.Option(min=1, help="Requests a second, Poisson arrivals.")],
    settings: Annotated[
        str, typer.Option(help="Comma list of B:W (batch, wait ms) and target:T (ms).")
    ] = "32:0",
    seconds: Annotated[float, typer.Option(min=1)] = 15,
    connections: Annotated[int, typer.Option(min=1)] = 64,
    clauses: Annotated[int, typer.Option(min=0)] = 6,
    out: Annotated[Path, typer.Option()] = Path("docs/bench"),
) -> None:
    bodies = [json.dumps({"inputs": t, "model": model}) for t in reviews(500, seed=3, max_clauses=clauses)]
    lines = [
        f"# Open-loop load: {model}, {rate:g} requests/s offered (Poisson), {seconds:g} s per setting",
        "",
        "| setting | served req/s | p50 ms | p99 ms | errors |",
        "|---|---|---|---|---|",
    ]
    for setting in [s.strip() for s in settings.split(",") if s.strip()]:
        with serve(repository, _env(setting)) as base:
            open_loop(base, "/v1/classify", bodies, rate, 3, connections)  # warm-up
            r = open_loop(base, "/v1/classify", bodies, rate, seconds, connections)
        lines.append(
            f"| {setting} | {r['served_rps']:.0f} | {r['p50_ms']:.1f} | {r['p99_ms']:.1f} | "
            f"{r['errors']:.0f} |"
        )
        print(lines[-1], flush=True)
    text = "\n".join(lines) + "\n"
    out.mkdir(parents=True, exist_ok=True)
    (out / f"open_loop-{model}-{rate:g}.md").write_text(text, encoding="utf-8")
    print(text)


if __name__ == "__main__":
    app()
