"""A locust run's CSVs (`--csv PREFIX --csv-full-history`) -> report.md, latency.png and throughput.png.

    python -m loadtests.report loadtests/reports/20261122-190000/locust      # writes beside the CSVs

Reads PREFIX_stats.csv (per endpoint totals), PREFIX_failures.csv (failures by error) and
PREFIX_stats_history.csv (one row a second per endpoint and for all together); the totals from
PREFIX_final_stats.csv and PREFIX_final_failures.csv instead where loadtests/locustfile.py wrote them at
the end of the run (locust's own files can miss the last second). A 429 is told from other
failures by its status code in the error text, so the report separates "the service shed load" from
"something is wrong". `make loadtest` (loadtests/run.py) writes the report after each run.
"""

from __future__ import annotations

import argparse
import csv
import re
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path
from typing import Any

AGGREGATED = "Aggregated"
TOO_MANY = re.compile(r"\b429\b")


@dataclass(frozen=True)
class Endpoint:
    """One stats row: a request type and name (locust's grouping), its totals and latency in ms."""

    method: str
    name: str
    requests: int
    failures: int
    rps: float
    p50: float | None
    p95: float | None
    p99: float | None
    max_ms: float | None
    too_many: int = 0  # failures that were a 429

    @property
    def other_failures(self) -> int:
        return self.failures - self.too_many


@dataclass(frozen=True)
class Failure:
    method: str
    name: str
    error: str
    occurrences: int


@dataclass(frozen=True)
class Sample:
    """One history row: the last seconds' rate and latency percentiles (ms) of one endpoint."""

    timestamp: float
    users: int
    rps: float
    failures_per_s: float
    p50: float | None
    p95: float | None
    p99: float | None


@dataclass(frozen=True)
class Report:
    endpoints: list[Endpoint]  # per endpoint, then the aggregate last
    failures: list[Failure]
    markdown: Path
    charts: list[Path]

    @property
    def total(self) -> Endpoint:
        return self.endpoints[-1]

    @property
    def unexpected_failures(self) -> int:
        """Failures that are not 429s: wrong status codes, bad bodies, broken streams, refused connections."""
        return self.total.other_failures


def _number(value: str) -> float | None:
    return None if value in ("", "N/A") else float(value)


def _rows(path: Path) -> list[dict[str, str]]:
    with path.open(newline="") as f:
        return list(csv.DictReader(f))


def _totals(prefix: Path, kind: str) -> Path:
    """PREFIX_final_KIND.csv (written after the last request) when there is one, else PREFIX_KIND.csv."""
    final = Path(f"{prefix}_final_{kind}.csv")
    return final if final.exists() else Path(f"{prefix}_{kind}.csv")


def read_failures(prefix: Path) -> list[Failure]:
    path = _totals(prefix, "failures")
    if not path.exists():
        return []
    return [Failure(r["Method"], r["Name"], r["Error"], int(r["Occurrences"])) for r in _rows(path)]


def read_endpoints(prefix: Path, failures: list[Failure]) -> list[Endpoint]:
    too_many: dict[tuple[str, str], int] = defaultdict(int)
    for failure in failures:
        if TOO_MANY.search(failure.error):
            too_many[(failure.method, failure.name)] += failure.occurrences
    endpoints = []
    for r in _rows(_totals(prefix, "stats")):
        method, name = r["Type"], r["Name"]
        is_total = name == AGGREGATED
        endpoints.append(
            Endpoint(
                method=method,
                name=name,
                requests=int(r["Request Count"]),
                failures=int(r["Failure Count"]),
                rps=float(r["Requests/s"]),
                p50=_number(r["50%"]),
                p95=_number(r["95%"]),
                p99=_number(r["99%"]),
                max_ms=_number(r["Max Response Time"]),
                too_many=sum(too_many.values()) if is_total else too_many[(method, name)],
            )
        )
    endpoints.sort(key=lambda e: (e.name == AGGREGATED, e.name, e.method))
    return endpoints


def read_history(prefix: Path) -> dict[str, list[Sample]]:
    """Endpoint name (AGGREGATED for all together) -> its samples in time order."""
    path = Path(f"{prefix}_stats_history.csv")
    history: dict[str, list[Sample]] = defaultdict(list)
    if not path.exists():
        return history
    for r in _rows(path):
        name = r["Name"] if r["Name"] == AGGREGATED else f"{r['Type']} {r['Name']}".strip()
        history[name].append(
            Sample(
                timestamp=float(r["Timestamp"]),
                users=int(r["User Count"]),
                rps=float(r["Requests/s"]),
                failures_per_s=float(r["Failures/s"]),
                p50=_number(r["50%"]),
                p95=_number(r["95%"]),
                p99=_number(r["99%"]),
            )
        )
    return history


def plot_latency(history: dict[str, list[Sample]], path: Path) -> None:
    """All requests' p50/p95/p99 over time (top); each endpoint's p95 (bottom)."""
    plt = pyplot()
    fig, (top, bottom) = plt.subplots(2, 1, figsize=(11, 8), sharex=True)
    total = history.get(AGGREGATED, [])
    start = _start(history)
    for attribute, style in (("p50", "-"), ("p95", "--"), ("p99", ":")):
        top.plot(*_series(total, attribute, start, positive=True), style, label=attribute)
    top.set_ylabel("ms")
    top.set_title("Response time percentiles, all requests (locust's last 10 s window)")
    top.legend(loc="upper left")
    for name, samples in _endpoints_of(history):
        bottom.plot(*_series(samples, "p95", start, positive=True), label=name)
    bottom.set_ylabel("ms")
    bottom.set_xlabel("seconds since start")
    bottom.set_title("p95 per endpoint")
    bottom.legend(loc="upper left", fontsize="small", ncol=2)
    for axis in (top, bottom):
        axis.set_yscale("log")
        axis.grid(True, which="both", alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def plot_throughput(history: dict[str, list[Sample]], path: Path) -> None:
    """Requests/s and failures/s of all requests, and the user count (top); requests/s per endpoint."""
    plt = pyplot()
    fig, (top, bottom) = plt.subplots(2, 1, figsize=(11, 8), sharex=True)
    total = history.get(AGGREGATED, [])
    start = _start(history)
    top.plot(*_series(total, "rps", start), label="requests/s")
    top.plot(*_series(total, "failures_per_s", start), label="failures/s (429s included)")
    top.set_ylabel("per second")
    top.set_title("Throughput, all requests")
    users = top.twinx()
    users.plot(*_series(total, "users", start), color="grey", alpha=0.5, label="users")
    users.set_ylabel("users")
    top.legend(loc="upper left")
    for name, samples in _endpoints_of(history):
        bottom.plot(*_series(samples, "rps", start), label=name)
    bottom.set_ylabel("requests/s")
    bottom.set_xlabel("seconds since start")
    bottom.set_title("Requests/s per endpoint")
    bottom.legend(loc="upper left", fontsize="small", ncol=2)
    for axis in (top, bottom):
        axis.grid(True, alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def pyplot() -> Any:
    """matplotlib's pyplot, drawing into files (Agg): imported only when a chart is drawn."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def _start(history: dict[str, list[Sample]]) -> float:
    return min((s[0].timestamp for s in history.values() if s), default=0.0)


def _series(
    samples: list[Sample], attribute: str, start: float, positive: bool = False
) -> tuple[list[float], list[float]]:
    """(seconds, values) of the samples with a value (a percentile is N/A, or 0, before any request)."""
    points = [(s.timestamp - start, getattr(s, attribute)) for s in samples]
    kept = [(t, float(v)) for t, v in points if v is not None and (v > 0 or not positive)]
    return [t for t, _ in kept], [v for _, v in kept]


def _endpoints_of(history: dict[str, list[Sample]]) -> list[tuple[str, list[Sample]]]:
    """The endpoints worth a line of their own: not the aggregate, the bad requests or /v1/models."""
    return sorted(
        (name, samples)
        for name, samples in history.items()
        if name != AGGREGATED and "[bad" not in name and not name.endswith("/v1/models")
    )


def _ms(value: float | None) -> str:
    return "-" if value is None else f"{value:.0f}"


def _share(part: int, whole: int) -> str:
    return "-" if whole == 0 else f"{100 * part / whole:.1f} %"


def render(
    endpoints: list[Endpoint], failures: list[Failure], run: dict[str, str], charts: list[Path]
) -> str:
    total = endpoints[-1]
    lines = ["# Load test report", ""]
    lines += [f"- {key}: {value}" for key, value in run.items()]
    verdict = (
        "none: every request got its expected answer or a 429"
        if total.other_failures == 0
        else f"**{total.other_failures}** (see Failures below)"
    )
    lines += [
        f"- requests: {total.requests} at {total.rps:.1f}/s; 429 (queue full): {total.too_many} "
        f"({_share(total.too_many, total.requests)}); other failures: {verdict}",
        "",
        "Latency in ms (a streamed generation: the whole stream; its first token: the `SSE` row). "
        "Bad requests (`[bad -> 4xx]`) succeed only when they get that status.",
        "",
        "| type | endpoint | requests | req/s | p50 | p95 | p99 | max | failures (not 429) | 429 share |",
        "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for e in endpoints:
        name = "**all**" if e.name == AGGREGATED else f"`{e.name}`"
        lines.append(
            f"| {e.method} | {name} | {e.requests} | {e.rps:.2f} | {_ms(e.p50)} | {_ms(e.p95)} "
            f"| {_ms(e.p99)} | {_ms(e.max_ms)} | {e.other_failures} | {_share(e.too_many, e.requests)} |"
        )
    if failures:
        lines += ["", "## Failures", "", "| type | endpoint | error | count |", "|---|---|---|---:|"]
        for f in sorted(failures, key=lambda f: -f.occurrences):
            error = f.error.replace("|", "\\|").replace("\n", " ")
            lines.append(f"| {f.method} | `{f.name}` | {error} | {f.occurrences} |")
    if charts:
        lines += ["", "## Over time", ""]
        lines += [f"![{chart.stem}]({chart.name})" for chart in charts]
    return "\n".join(lines) + "\n"


def write_report(prefix: Path, out_dir: Path | None = None, run: dict[str, str] | None = None) -> Report:
    """Read the CSVs at `prefix`, write report.md and the charts into `out_dir` (default: beside them)."""
    out_dir = out_dir or prefix.parent
    out_dir.mkdir(parents=True, exist_ok=True)
    failures = read_failures(prefix)
    endpoints = read_endpoints(prefix, failures)
    if not endpoints or endpoints[-1].name != AGGREGATED:
        raise ValueError(f"{prefix}_stats.csv has no {AGGREGATED!r} row: did the locust run start?")
    history = read_history(prefix)
    charts = []
    if history.get(AGGREGATED):
        charts = [out_dir / "latency.png", out_dir / "throughput.png"]
        plot_latency(history, charts[0])
        plot_throughput(history, charts[1])
    markdown = out_dir / "report.md"
    markdown.write_text(render(endpoints, failures, run or {}, charts))
    return Report(endpoints, failures, markdown, charts)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m loadtests.report", description=__doc__.split("\n")[0])
    parser.add_argument("prefix", type=Path, help="the --csv prefix of a locust run (PREFIX_stats.csv ...)")
    parser.add_argument("--out", type=Path, default=None, help="where to write (default: beside the CSVs)")
    args = parser.parse_args(argv)
    report = write_report(args.prefix, args.out)
    print(report.markdown.read_text())
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
