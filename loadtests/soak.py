"""`make soak`: minutes of mixed traffic over every endpoint, the service's memory and descriptors sampled.

    python -m loadtests.soak run --minutes 10 --users 8 --out docs/bench

Starts the service (`python -m service`) on a free port, runs locust headless with loadtests/locustfile.py
(every endpoint: /v1 classify, qa, fill-mask, generate whole and streamed, /v1/completions whole and
streamed, /v2 infer; inputs of varied lengths; a share of deliberate bad input, a success only when it gets
its 4xx) at a steady number of users, and every --interval seconds reads the RSS and open file descriptors
of every process of the service (supervisor, engine core, each frontend) from /proc. A leak shows as growth
after the first minute, when every model has met most shapes and every connection is open.

Writes OUT/soak.md (figures, the bars with their verdicts, a table per process), OUT/soak.json (every
sample) and OUT/soak.png; locust's CSVs and report and the service's log go to WORK/<timestamp>/. Exit
status 1 when a bar fails: an error other than bad input's expected 4xx, RSS growing 10 % or more from the
first minute to the end in any process, descriptors not flat, a process restarted.
"""

from __future__ import annotations

import json
import os
import resource
import shlex
import subprocess
import threading
import time
from collections.abc import Callable
from datetime import datetime
from importlib.metadata import version
from pathlib import Path
from types import TracebackType
from typing import Annotated

import typer

from common.cli import cli_app, print_error
from common.progress import ProgressLog, clock
from loadtests.process_cpu import cpu_by_thread_name, machine_busy_s
from loadtests.process_memory import sample_tree
from loadtests.report import AGGREGATED, read_endpoints, read_failures, read_history, write_report
from loadtests.run import free_port, launched, locust_command, served_models
from loadtests.soak_report import Snapshot, Soak, Traffic, from_json, growth_of, holds, write

app = cli_app(help=__doc__)
QUIET_S = 2.0  # after the load, before the last sample: the clients' connections are closed by then


class Sampler:
    """The process tree of `root` sampled every `interval_s` seconds on a thread of its own, from when the
    block starts (t = 0) until it ends."""

    def __init__(
        self,
        root: int,
        interval_s: float,
        on_sample: Callable[[Snapshot], None] = lambda _: None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.root, self.interval_s, self.on_sample, self.clock = root, interval_s, on_sample, clock
        self.snapshots: list[Snapshot] = []
        self._started = 0.0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="soak-sampler", daemon=True)

    def sample(self) -> Snapshot:
        """The tree now (not kept among the snapshots)."""
        return Snapshot(round(self.clock() - self._started, 3), sample_tree(self.root))

    def __enter__(self) -> Sampler:
        self._started = self.clock()
        self._thread.start()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        self._stop.set()
        self._thread.join()

    def _loop(self) -> None:
        next_at = self.clock()
        while True:
            snapshot = self.sample()
            self.snapshots.append(snapshot)
            self.on_sample(snapshot)
            next_at += self.interval_s  # a steady grid: a slow read does not shift the later samples
            if self._stop.wait(max(0.0, next_at - self.clock())):
                return


def cpu_mark(pid: int) -> tuple[float, float, float, float]:
    """(wall clock, the machine's busy CPU seconds, the service's, this process's and its reaped children's
    (locust's, once it has exited))."""
    me, children = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    ours = me.ru_utime + me.ru_stime + children.ru_utime + children.ru_stime
    return time.monotonic(), machine_busy_s(), sum(cpu_by_thread_name(pid).values()), ours


def cpu_shares(before: tuple[float, ...], after: tuple[float, ...]) -> str:
    """Cores kept busy on average between two marks, by whom: on a shared machine the last figure is the
    other work that ran beside the measurement."""
    wall, busy, service, ours = (b - a for a, b in zip(before, after, strict=True))
    return (
        f"cores busy on average during the load: the service {service / wall:.2f}, locust and this driver "
        f"{ours / wall:.2f}, other work on the machine {max(0.0, busy - service - ours) / wall:.2f}"
    )


def requests_so_far(prefix: Path) -> tuple[int, int] | None:
    """(requests, failures) of the run so far, from the stats CSV locust rewrites every second."""
    try:
        total = read_endpoints(prefix, [])[-1]
    except (OSError, ValueError, KeyError, IndexError):
        return None
    return (total.requests, total.failures) if total.name == AGGREGATED else None


@app.command("run")
def run(
    minutes: Annotated[float, typer.Option(help="How long the load runs.")] = 10.0,
    users: Annotated[int, typer.Option(help="Concurrent locust users (steady once all started).")] = 8,
    spawn_rate: Annotated[float, typer.Option(help="Users started a second.")] = 4.0,
    interval: Annotated[float, typer.Option(help="Seconds between samples of RSS and descriptors.")] = 5.0,
    repository: Annotated[Path, typer.Option(help="The model repository to serve.")] = Path("models"),
    frontends: Annotated[int, typer.Option(help="DISTILSERVE_FRONTENDS; 0: the service's default.")] = 0,
    out: Annotated[Path, typer.Option(help="Directory for soak.md, soak.json and soak.png.")] = Path(
        "docs/bench"
    ),
    work: Annotated[Path, typer.Option(help="Locust's files and the service's log, per run.")] = Path(
        "loadtests/reports"
    ),
    ready_timeout: Annotated[float, typer.Option(help="Seconds to wait for /ready.")] = 300.0,
) -> None:
    """Serve, load for --minutes while sampling every process, then write the report."""
    started = datetime.now()
    folder = work / started.strftime("soak-%Y%m%d-%H%M%S")
    folder.mkdir(parents=True, exist_ok=False)
    prefix = folder / "locust"
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    env = {"DISTILSERVE_FRONTENDS": str(frontends)} if frontends else {}
    seconds = round(minutes * 60)
    with launched("127.0.0.1", port, repository, folder / "service.log", ready_timeout, env) as service:
        served = served_models(url)
        command = locust_command(url, users, spawn_rate, f"{seconds}s", folder)
        print(shlex.join(command), flush=True)
        with ProgressLog("soak", active=True) as progress:

            def report_progress(snapshot: Snapshot) -> None:
                counts = requests_so_far(prefix)
                progress.update(
                    status=f"{clock(snapshot.t_s)} of {clock(seconds)}",
                    requests=str(counts[0]) if counts else "-",
                    errors=str(counts[1]) if counts else "-",
                    rss=f"{sum(p.rss_mib for p in snapshot.processes):.0f} MiB",
                    fds=str(sum(p.fds for p in snapshot.processes)),
                )

            with Sampler(service.pid, interval, report_progress) as sampler:
                before = cpu_mark(service.pid)
                subprocess.run(command, check=False)  # exits 1 on any failure: the report judges
                cpu = cpu_shares(before, cpu_mark(service.pid))
            time.sleep(QUIET_S)
            after = sampler.sample()
    if not Path(f"{prefix}_stats.csv").exists():
        print_error("locust wrote no stats: see its output above")
        raise typer.Exit(2)
    failures = read_failures(prefix)
    run_info = {
        "started": started.isoformat(timespec="seconds"),
        "models": served,
        "load": f"{users} locust users (spawn rate {spawn_rate:g}/s) for {minutes:g} min, "
        f"samples every {interval:g} s",
        "frontends": f"{sum(p.name.startswith('ds-frontend') for p in after.processes)}"
        + ("" if frontends else " (the service's default)"),
        "machine": f"{len(os.sched_getaffinity(0))} cores; {cpu}",
        "locust": version("locust"),
        "work": str(folder),
    }
    write_report(prefix, folder, run_info)  # locust's own view: latency and throughput per endpoint
    soak = Soak(
        run=run_info,
        traffic=Traffic.of(read_endpoints(prefix, failures), failures),
        snapshots=sampler.snapshots,
        after=after,
        history=read_history(prefix).get(AGGREGATED, []),
    )
    markdown = write(out, soak)
    total = growth_of(soak)[-1]
    print(
        f"{markdown}: {soak.traffic.requests} requests, {soak.traffic.errors} errors, "
        f"{soak.traffic.bad_input} bad input answered 4xx; RSS {total.rss_settled_mib:.0f} MiB at 1 min, "
        f"{total.rss_end_mib:.0f} MiB at the end ({total.growth:+.1%}); fds {total.fds_start} before, "
        f"{total.fds_settled} at 1 min, {total.fds_end} at the end, {total.fds_after} after"
    )
    if not holds(soak):
        raise typer.Exit(1)


@app.command("report")
def report(
    out: Annotated[Path, typer.Option(help="Directory holding soak.json.")] = Path("docs/bench"),
) -> None:
    """Write soak.md and soak.png again from a run's soak.json: nothing is measured."""
    write(out, from_json(json.loads((out / "soak.json").read_text(encoding="utf-8"))))


if __name__ == "__main__":
    app()
