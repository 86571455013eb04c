"""What OpenTelemetry tracing costs the service: throughput and latency with tracing off, and on at two
sampling ratios, served alternately in one run.

    python -m benchmarks.tracing_overhead --repository models --connections 64 --seconds 20 --rounds 3 \\
        --out docs/bench

Each round serves the demo classifier three ways, each on a fresh `python -m service` (tracing is set up at
start-up): off (`OTEL_SDK_DISABLED=true`: nothing of the SDK loaded), then on with `OTEL_TRACES_SAMPLER`
(`--sampler`, parentbased_traceidratio by default; wrk sends no `traceparent`, so both samplers decide per
trace id alike) at each `--ratios` argument (1.0 and 0.01). Every traced server exports over OTLP/HTTP to a
sink in this process that only counts what it is sent (posts, spans), so the export's own cost is the SDK's
(batching, encoding, the HTTP post) and not a collector's. The load is wrk's: `--connections` clients sending
one review each to /v1/classify, `--seconds` after a 2 s warm-up. The sink, wrk and the service share the
machine's cores: say so beside a figure.

A traced request makes 5 spans in its frontend (server, tokenize, queue, engine, postprocess) and its batch
one in the engine core, shared with the other traced requests of that batch (service.tracing).
"""

from __future__ import annotations

import json
import statistics
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.console import Console

from benchmarks.servers import serve
from benchmarks.wrk_load import load, metric_totals
from common.cli import cli_app
from common.progress import ProgressLog
from loadtests.texts import reviews

console = Console(stderr=True)
app = cli_app(help=__doc__)

SAMPLERS = ("parentbased_traceidratio", "traceidratio")


class SpanSink(ThreadingHTTPServer):
    """An OTLP/HTTP trace endpoint that counts what it is sent and keeps nothing."""

    daemon_threads = True

    def __init__(self) -> None:
        super().__init__(("127.0.0.1", 0), _SinkHandler)
        self.lock = threading.Lock()
        self.posts = 0
        self.spans = 0

    @property
    def endpoint(self) -> str:
        return f"http://127.0.0.1:{self.server_address[1]}"

    def counts(self) -> tuple[int, int]:
        with self.lock:
            return self.posts, self.spans


class _SinkHandler(BaseHTTPRequestHandler):
    server: SpanSink

    def do_POST(self) -> None:
        from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest

        body = self.rfile.read(int(self.headers["Content-Length"]))
        spans = sum(
            len(scope.spans)
            for resource in ExportTraceServiceRequest.FromString(body).resource_spans
            for scope in resource.scope_spans
        )
        with self.server.lock:
            self.server.posts += 1
            self.server.spans += spans
        self.send_response(200)
        self.send_header("Content-Type", "application/x-protobuf")
        self.send_header("Content-Length", "0")
        self.end_headers()

    def log_message(self, *args: Any) -> None:
        pass


@contextmanager
def span_sink() -> Iterator[SpanSink]:
    sink = SpanSink()
    thread = threading.Thread(target=sink.serve_forever, daemon=True)
    thread.start()
    try:
        yield sink
    finally:
        sink.shutdown()
        sink.server_close()


@dataclass
class Setting:
    name: str
    ratio: float | None  # None: tracing off

    def env(self, sink: SpanSink, sampler: str) -> dict[str, str]:
        if self.ratio is None:
            return {"OTEL_SDK_DISABLED": "true"}
        return {
            "OTEL_SDK_DISABLED": "false",
            "OTEL_EXPORTER_OTLP_ENDPOINT": sink.endpoint,
            "OTEL_TRACES_SAMPLER": sampler,
            "OTEL_TRACES_SAMPLER_ARG": f"{self.ratio:g}",
        }


@dataclass
class Row:
    round: int
    setting: str
    ratio: float | None
    rps: float
    p50_ms: float
    p99_ms: float
    errors: int
    requests: int  # every request the server answered (warm-up included)
    spans: int  # spans it exported, until it stopped
    posts: int


def settings_for(ratios: list[float]) -> list[Setting]:
    return [Setting("off", None), *(Setting(f"on, ratio {r:g}", r) for r in ratios)]


def measure(
    repository: Path,
    setting: Setting,
    sink: SpanSink,
    sampler: str,
    bodies: list[str],
    connections: int,
    seconds: int,
    round_: int,
) -> Row:
    """One fresh server with `setting`: warm-up, `seconds` of wrk, its request count; then it stops (and
    flushes its spans), and what the sink got from it is counted."""
    posts_before, spans_before = sink.counts()
    with serve(repository, setting.env(sink, sampler)) as base:
        load("warm-up", base, "/v1/classify", bodies, connections, 2)
        result = load(setting.name, base, "/v1/classify", bodies, connections, seconds)
        requests = int(metric_totals(base).get("distilserve_requests_total", 0.0))
    posts, spans = sink.counts()  # the server has stopped: its last spans were flushed as it did
    return Row(
        round_,
        setting.name,
        setting.ratio,
        result.rps,
        result.p50_ms,
        result.p99_ms,
        result.errors,
        requests,
        spans - spans_before,
        posts - posts_before,
    )


def render(
    rows: list[Row], settings: list[Setting], sampler: str, model: str, connections: int, seconds: int
) -> str:
    lines = [
        "# What tracing costs: off against on at two sampling ratios",
        "",
        f"`python -m benchmarks.tracing_overhead`: `{model}`, wrk at {connections} connections, one review a "
        f"request to /v1/classify, {seconds} s per setting on a fresh `python -m service` after a 2 s "
        f"warm-up, settings alternating round by round. On: `OTEL_TRACES_SAMPLER={sampler}` at the ratio "
        "shown, exporting over OTLP/HTTP to a sink in the benchmark's process that only counts; it, wrk and "
        "the service share the machine's cores.",
        "",
        "| round | setting | req/s | p50 ms | p99 ms | errors | spans exported | spans / request |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        per_request = r.spans / r.requests if r.requests else 0.0
        lines.append(
            f"| {r.round} | {r.setting} | {r.rps:,.0f} | {r.p50_ms:.1f} | {r.p99_ms:.1f} | {r.errors} "
            f"| {r.spans:,} | {per_request:.3f} |"
        )
    off = [r.rps for r in rows if r.ratio is None]
    lines += [
        "",
        "| setting | median req/s | of off | median p50 ms | median p99 ms |",
        "|---|---|---|---|---|",
    ]
    for s in settings:
        mine = [r for r in rows if r.setting == s.name]
        rps = statistics.median(r.rps for r in mine)
        share = rps / statistics.median(off) if off else 0.0
        lines.append(
            f"| {s.name} | {rps:,.0f} | {share:.1%} | {statistics.median(r.p50_ms for r in mine):.1f} "
            f"| {statistics.median(r.p99_ms for r in mine):.1f} |"
        )
    return "\n".join(lines) + "\n"


def parse_ratios(text: str) -> list[float]:
    ratios = [float(p) for p in text.split(",") if p.strip()]
    if not ratios or any(not 0.0 <= r <= 1.0 for r in ratios):
        raise typer.BadParameter("comma-separated sampling ratios in [0, 1]")
    return ratios


@app.command()
def run(
    repository: Annotated[Path, typer.Option(help="A repository with the model (make models).")] = Path(
        "models"
    ),
    model: Annotated[str, typer.Option(help="A classification model of the repository.")] = "sentiment",
    connections: Annotated[int, typer.Option(min=1, help="wrk connections: the load level.")] = 64,
    seconds: Annotated[int, typer.Option(min=1, help="Seconds of load per setting and round.")] = 20,
    rounds: Annotated[int, typer.Option(min=1, help="Rounds; each serves every setting once.")] = 3,
    sampler: Annotated[
        str, typer.Option(help=f"OTEL_TRACES_SAMPLER when on: {' or '.join(SAMPLERS)}.")
    ] = SAMPLERS[0],
    ratios: Annotated[
        str, typer.Option(help="OTEL_TRACES_SAMPLER_ARG values to serve with tracing on, comma-separated.")
    ] = "1.0,0.01",
    out: Annotated[Path, typer.Option(help="Directory for tracing_overhead.md and .json.")] = Path(
        "docs/bench"
    ),
) -> None:
    """Serve tracing off and on at each ratio, alternating, and write the report."""
    if sampler not in SAMPLERS:
        raise typer.BadParameter(f"--sampler: one of {', '.join(SAMPLERS)}")
    settings = settings_for(parse_ratios(ratios))
    bodies = [json.dumps({"inputs": t, "model": model}) for t in reviews(500, seed=3)]
    rows: list[Row] = []
    with (
        span_sink() as sink,
        ProgressLog.beside(console, "tracing overhead", rounds * len(settings), unit="servers") as progress,
    ):
        for i in range(1, rounds + 1):
            for setting in settings:
                progress.update(status=f"round {i}: {setting.name}")
                rows.append(measure(repository, setting, sink, sampler, bodies, connections, seconds, i))
                progress.update(advance=1)
    report = render(rows, settings, sampler, model, connections, seconds)
    out.mkdir(parents=True, exist_ok=True)
    (out / "tracing_overhead.md").write_text(report)
    (out / "tracing_overhead.json").write_text(
        json.dumps(
            {
                "model": model,
                "connections": connections,
                "seconds": seconds,
                "sampler": sampler,
                "rows": [asdict(r) for r in rows],
            },
            indent=2,
        )
    )
    console.print(report)


if __name__ == "__main__":
    app()
