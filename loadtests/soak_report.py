"""A soak run's figures, verdicts, markdown table and plot, from its samples and its locust totals.

Kept apart from the driver (loadtests/soak.py) so that a run's soak.json can be drawn again without running
anything, and so that the arithmetic (growth from the first minute to the end, descriptors flat, errors
apart from deliberate bad input) is tested on made-up samples.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from loadtests.process_memory import ProcessSample
from loadtests.report import AGGREGATED, Endpoint, Failure, Sample, pyplot

GROWTH_BAR = 0.10  # RSS growth from the first minute to the end that a leak-free service stays under
SETTLED_S = 60.0  # the baseline: by then every model has met most shapes, every connection is open
FD_SLACK = 4  # descriptors a process may hold beyond the count compared with (a connection in flight)
TOTAL = "total"


@dataclass(frozen=True)
class Snapshot:
    """Every process of the service at one moment, `t_s` seconds after the load began."""

    t_s: float
    processes: list[ProcessSample]


@dataclass(frozen=True)
class Traffic:
    """What the load generator counted: errors are failures of real requests (429s included); a bad
    request that got its expected 4xx is a success, counted apart."""

    requests: int
    errors: int
    too_many: int  # of the errors, 429s (the queue was full)
    bad_input: int  # deliberate bad requests answered with their expected 4xx
    bad_input_wrong: int  # deliberate bad requests that got anything else (also among the errors)
    rps: float

    @classmethod
    def of(cls, endpoints: list[Endpoint], failures: list[Failure]) -> Traffic:
        total = next(e for e in endpoints if e.name == AGGREGATED)
        bad = [e for e in endpoints if "[bad ->" in e.name]
        return cls(
            requests=total.requests,
            errors=total.failures,
            too_many=total.too_many,
            bad_input=sum(e.requests - e.failures for e in bad),
            bad_input_wrong=sum(e.failures for e in bad),
            rps=total.rps,
        )


@dataclass(frozen=True)
class Soak:
    """One run: what it was, what the clients counted, the samples under load and one once it ended."""

    run: dict[str, str]
    traffic: Traffic
    snapshots: list[Snapshot]  # under load, the first one before any request
    after: Snapshot | None = None  # once every client had gone
    history: list[Sample] = field(default_factory=list)  # locust's requests/s and failures/s


@dataclass(frozen=True)
class Growth:
    """One process (or all together, TOTAL) from the first sample to the end and after."""

    name: str
    rss_start_mib: float  # before the first request
    rss_settled_mib: float  # the first sample at or after SETTLED_S
    rss_end_mib: float  # the last sample under load
    rss_max_mib: float
    fds_start: int
    fds_settled: int
    fds_end: int
    fds_max: int
    fds_after: int | None  # once the clients had gone (None: no such sample)

    @property
    def growth(self) -> float:
        """RSS growth from the first minute to the end, as a fraction of the first minute's."""
        return self.rss_end_mib / self.rss_settled_mib - 1 if self.rss_settled_mib else 0.0

    @property
    def rss_holds(self) -> bool:
        return self.growth < GROWTH_BAR

    @property
    def fds_flat(self) -> bool:
        """No more descriptors at the end than at the first minute, nor once the clients had gone than
        before they came: a leak is a socket or a file that outlives its request."""
        after = self.fds_start if self.fds_after is None else self.fds_after
        return self.fds_end <= self.fds_settled + FD_SLACK and after <= self.fds_start + FD_SLACK


def settled_index(snapshots: list[Snapshot]) -> int:
    """The first snapshot at or after SETTLED_S (the last one in a shorter run)."""
    return next((i for i, s in enumerate(snapshots) if s.t_s >= SETTLED_S), len(snapshots) - 1)


def names_of(snapshots: list[Snapshot]) -> list[str]:
    """Every process name seen, in the order first seen."""
    return list(dict.fromkeys(p.name for s in snapshots for p in s.processes))


def series(snapshots: list[Snapshot], name: str, attribute: str) -> tuple[list[float], list[float]]:
    """(seconds, values) of one process's `attribute` (rss_mib or fds), or of all together for TOTAL."""
    times, values = [], []
    for s in snapshots:
        picked = s.processes if name == TOTAL else [p for p in s.processes if p.name == name]
        if picked:
            times.append(s.t_s)
            values.append(float(sum(getattr(p, attribute) for p in picked)))
    return times, values


def growth_of(soak: Soak) -> list[Growth]:
    """Per process that lived from the first minute to the end, then TOTAL."""
    snapshots = soak.snapshots
    if not snapshots:
        return []
    settled = settled_index(snapshots)
    rows = []
    for name in [*names_of(snapshots), TOTAL]:
        _, rss = series(snapshots, name, "rss_mib")
        _, fds = series(snapshots, name, "fds")
        _, late = series(snapshots[settled:], name, "rss_mib")
        if len(late) != len(snapshots) - settled:
            continue  # not there at the first minute, or gone before the end
        _, after = series([soak.after] if soak.after else [], name, "fds")
        rows.append(
            Growth(
                name=name,
                rss_start_mib=rss[0],
                rss_settled_mib=late[0],
                rss_end_mib=late[-1],
                rss_max_mib=max(rss),
                fds_start=int(fds[0]),
                fds_settled=int(fds[len(fds) - len(late)]),
                fds_end=int(fds[-1]),
                fds_max=int(max(fds)),
                fds_after=int(after[0]) if after else None,
            )
        )
    return rows


def replaced(snapshots: list[Snapshot]) -> dict[str, int]:
    """Process slots whose pid changed during the run (a crash and a restart), with how many times."""
    pids: dict[str, list[int]] = {}
    for s in snapshots:
        for p in s.processes:
            seen = pids.setdefault(p.name, [])
            if not seen or seen[-1] != p.pid:
                seen.append(p.pid)
    return {name: len(seen) - 1 for name, seen in pids.items() if len(seen) > 1}


def verdict(soak: Soak) -> list[str]:
    """The issue's bars, one line each, with this run's figures and ✔ or ✘."""
    traffic, rows = soak.traffic, growth_of(soak)
    lines = [
        f"- errors 0 apart from deliberate bad input: {traffic.errors} "
        f"({traffic.too_many} of them 429) {'✔' if traffic.errors == 0 else '✘'}",
    ]
    total = next((r for r in rows if r.name == TOTAL), None)
    processes = [r for r in rows if r.name != TOTAL]
    if total is not None and processes:
        worst = max(processes, key=lambda r: r.growth)
        lines.append(
            f"- RSS growth from the first minute to the end < {GROWTH_BAR:.0%} in every process: all "
            f"together {total.growth:+.1%}, the most {worst.name} {worst.growth:+.1%} "
            f"{'✔' if all(r.rss_holds for r in rows) else '✘'}"
        )
        after = "" if total.fds_after is None else f", once the clients had gone {total.fds_after}"
        lines.append(
            f"- file descriptors flat (per process, at the end ≤ at 1 min + {FD_SLACK}, after the load ≤ "
            f"before it + {FD_SLACK}): before {total.fds_start}, at 1 min {total.fds_settled}, at the end "
            f"{total.fds_end}{after} {'✔' if all(r.fds_flat for r in rows) else '✘'}"
        )
    if restarts := replaced(soak.snapshots):
        counts = ", ".join(f"{name} {times} times" for name, times in restarts.items())
        lines.append(f"- no process restarted: {counts} ✘")
    return lines


def holds(soak: Soak) -> bool:
    return all(line.endswith("✔") for line in verdict(soak))


def render(soak: Soak, plot_name: str) -> str:
    traffic, snapshots = soak.traffic, soak.snapshots
    settled = snapshots[settled_index(snapshots)].t_s if snapshots else 0.0
    lines = ["# Soak: mixed traffic over every endpoint, memory and descriptors sampled", ""]
    lines += [f"- {key}: {value}" for key, value in soak.run.items()]
    lines += [
        f"- requests: {traffic.requests} ({traffic.rps:.1f}/s); errors: {traffic.errors} "
        f"({traffic.too_many} of them 429); deliberate bad input answered with its 4xx: {traffic.bad_input} "
        f"(answered otherwise: {traffic.bad_input_wrong}, counted among the errors)",
        f"- samples: {len(snapshots)} under load (the first before any request, the first minute's at "
        f"{settled:.0f} s, the last at {snapshots[-1].t_s if snapshots else 0:.0f} s)"
        + (", one once the clients had gone" if soak.after else ""),
        "",
        *verdict(soak),
        "",
        "| process | RSS before, MiB | at 1 min | at the end | growth | max | fds before | at 1 min "
        "| at the end | max | after |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for r in growth_of(soak):
        name = "**all**" if r.name == TOTAL else f"`{r.name}`"
        lines.append(
            f"| {name} | {r.rss_start_mib:.1f} | {r.rss_settled_mib:.1f} | {r.rss_end_mib:.1f} "
            f"| {r.growth:+.1%} | {r.rss_max_mib:.1f} | {r.fds_start} | {r.fds_settled} | {r.fds_end} "
            f"| {r.fds_max} | {'-' if r.fds_after is None else r.fds_after} |"
        )
    lines += ["", f"![soak]({plot_name})"]
    return "\n".join(lines) + "\n"


def plot(soak: Soak, path: Path) -> None:
    """RSS per process (top), open descriptors per process (middle), requests/s and failures/s (bottom)."""
    plt = pyplot()
    fig, (rss, fds, rate) = plt.subplots(3, 1, figsize=(13, 10), sharex=True)
    snapshots = soak.snapshots
    settled = snapshots[settled_index(snapshots)].t_s / 60 if snapshots else 0.0
    for name in [*names_of(snapshots), TOTAL]:
        style = "k--" if name == TOTAL else "-"
        for axis, attribute in ((rss, "rss_mib"), (fds, "fds")):
            times, values = series(snapshots, name, attribute)
            axis.plot([t / 60 for t in times], values, style, label=name)
    rss.set_ylabel("RSS, MiB")
    rss.set_title("Resident memory per process")
    fds.set_ylabel("open file descriptors")
    fds.set_title("Open file descriptors per process")
    if soak.history:
        start = soak.history[0].timestamp
        minutes = [(s.timestamp - start) / 60 for s in soak.history]
        rate.plot(minutes, [s.rps for s in soak.history], label="requests/s")
        rate.plot(
            minutes, [s.failures_per_s for s in soak.history], label="failures/s\n(bad input's 4xx\nis none)"
        )
    rate.set_ylabel("per second")
    rate.set_xlabel("minutes since the load began")
    rate.set_title("Traffic (locust, last 10 s)")
    for axis in (rss, fds, rate):
        axis.axvline(settled, color="grey", linestyle=":", label="1 min")
        axis.grid(True, alpha=0.3)
        axis.legend(loc="upper left", bbox_to_anchor=(1.01, 1.0), fontsize="small")
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def to_json(soak: Soak) -> dict[str, Any]:
    return {
        "run": soak.run,
        "traffic": asdict(soak.traffic),
        "growth": [asdict(r) | {"growth": r.growth} for r in growth_of(soak)],
        "snapshots": [asdict(s) for s in soak.snapshots],
        "after": asdict(soak.after) if soak.after else None,
        "history": [asdict(s) for s in soak.history],
    }


def from_json(data: dict[str, Any]) -> Soak:
    def snapshot(raw: dict[str, Any]) -> Snapshot:
        return Snapshot(raw["t_s"], [ProcessSample(**p) for p in raw["processes"]])

    return Soak(
        run=data["run"],
        traffic=Traffic(**data["traffic"]),
        snapshots=[snapshot(s) for s in data["snapshots"]],
        after=snapshot(data["after"]) if data.get("after") else None,
        history=[Sample(**s) for s in data.get("history", [])],
    )


def write(out: Path, soak: Soak) -> Path:
    """OUT/soak.json, soak.md and soak.png; the markdown's path."""
    out.mkdir(parents=True, exist_ok=True)
    (out / "soak.json").write_text(json.dumps(to_json(soak), indent=1), encoding="utf-8")
    plot(soak, out / "soak.png")
    markdown = out / "soak.md"
    markdown.write_text(render(soak, "soak.png"), encoding="utf-8")
    return markdown
