"""`make bench`: the service under load over HTTP, in one run, against its own engine and a naive server.

    python -m benchmarks.http_bench run --repository models --demo build/demo --out docs/bench

- classification (the demo student, and a MiniLM-shaped model: 6 layers x 384): batching on vs
  DISTILSERVE_MAX_BATCH_SIZE=1, each with one HTTP frontend and with --frontends, vs a naive FastAPI +
  transformers pipeline server, at 1, 8 and 64 connections; and at 64, the same engine and batcher
  behind a bare ASGI callable (benchmarks/bare_server.py), about the most a Python HTTP layer in front of
  it could serve,
  driven by wrk (C, not a Python client that would measure itself); the engine's raw throughput at each
  batch size in a separate process, as one call on every core and as one single-threaded call per core;
  padding efficiency and mean batch size from the service's own metrics;
- QA and fill-mask at 8 connections;
- generation: aggregate tokens/s and time to first token at 1, 4 and 16 streams, continuous batching vs
  DISTILSERVE_GEN_MAX_BATCH=1, each pair back to back (three pairs at 16 streams, their median reported).
Every figure comes from this one run; nothing else should run on the machine meanwhile.
"""

from __future__ import annotations

import json
import os
import shutil
import statistics
import tempfile
from dataclasses import asdict
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.console import Console

from benchmarks.plots import saved_figure
from benchmarks.raw_engine import raw_engine
from benchmarks.servers import serve, serve_naive
from benchmarks.shapes import MINILM_BERT_CONFIG
from benchmarks.streams import generation_load
from benchmarks.wrk_load import LoadResult, load
from common.cli import cli_app
from common.progress import ProgressLog
from loadtests.texts import CONTEXT, QUESTIONS, reviews

console = Console(stderr=True)
app = cli_app(help=__doc__)


# -- models -----------------------------------------------------------------------------------------------


def minilm_shaped(demo: Path, repository: Path) -> None:
    """A classifier of all-MiniLM-L6-v2's shape (6 x 384, 12 heads) with random weights: its speed, no hub."""
    if (repository / "minilm-shaped").is_dir():
        return
    from transformers import AutoTokenizer, BertConfig, BertForSequenceClassification

    from export.pipeline import export_model

    tokenizer = AutoTokenizer.from_pretrained(demo / "text-classification" / "student")
    config = BertConfig(
        **MINILM_BERT_CONFIG,
        num_labels=2,
        id2label={0: "negative", 1: "positive"},
        label2id={"negative": 0, "positive": 1},
    )
    with tempfile.TemporaryDirectory() as tmp:
        BertForSequenceClassification(config).save_pretrained(tmp)
        tokenizer.save_pretrained(tmp)
        export_model(  # random weights: a speed test, so the variants are written without eval data
            Path(tmp),
            "text-classification",
            "minilm-shaped",
            repository,
            ("fp32", "int8", "fp16"),
            require_eval_data=False,
        )


# -- report -------------------------------------------------------------------------------------------------


def render(
    classification: dict[str, Any], others: list[LoadResult], generation: list[dict], device: str = "cpu"
) -> str:
    where = f"{os.cpu_count()} CPU cores" if device == "cpu" else f"GPU, {os.cpu_count()} CPU cores"
    lines = [f"# Service benchmark (`make bench`), {where}", ""]
    for model, section in classification.items():
        raw = section["raw"]
        best = max(raw.values())
        lines += [
            f"## Classification: {model}",
            "",
            "Raw engine (ONNX Runtime alone, separate process, length-grouped batches; bN: batches of N "
            "on every core, bN CxT: C such calls at once, T threads each), sequences/s: "
            + ", ".join(f"{k} {v:.0f}" for k, v in raw.items())
            + f"; best {best:.0f}.",
            "",
            "| server | clients | req/s | p50 ms | p99 ms | errors | mean batch | padding eff. | "
            "vs best raw | engine busy | wrk CPU |",
            "|---|---|---|---|---|---|---|---|---|---|---|",
        ]
        for r in section["load"]:
            mean = "-" if r.mean_batch is None else f"{r.mean_batch:.1f}"
            eff = "-" if r.padding_efficiency is None else f"{r.padding_efficiency:.2f}"
            busy = "-" if r.engine_busy is None else f"{r.engine_busy:.0%}"
            lines.append(
                f"| {r.server} | {r.connections} | {r.rps:.0f} | {r.p50_ms:.1f} | {r.p99_ms:.1f} | "
                f"{r.errors} | {mean} | {eff} | {r.rps / best:.2f} | {busy} | {r.client_cpu:.0%} |"
            )
        lines += ["", *bars(section["load"], best, device), ""]
    lines += [
        "## QA and fill-mask (8 clients)",
        "",
        "| task | req/s | p50 ms | p99 ms | errors | mean batch |",
        "|---|---|---|---|---|---|",
    ]
    for r in others:
        mean = "-" if r.mean_batch is None else f"{r.mean_batch:.1f}"
        lines.append(f"| {r.server} | {r.rps:.0f} | {r.p50_ms:.1f} | {r.p99_ms:.1f} | {r.errors} | {mean} |")
    lines += [
        "",
        "## Generation (64 new tokens per request, streamed)",
        "",
        "| engine | streams | tokens/s | TTFT p50 ms | TTFT p99 ms | requests | errors | client CPU |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for g in generation:
        lines.append(
            f"| {g['engine']} | {g['streams']} | {g['tokens_per_s']:.0f} | {g['ttft_p50_ms']:.1f} | "
            f"{g['ttft_p99_ms']:.1f} | {g['requests']} | {g['errors']} | {g.get('client_cpu', 0):.0%} |"
        )
    for streams in sorted({g["streams"] for g in generation}):
        ratios = generation_ratios(generation, streams)
        if ratios:
            lines += [
                "",
                f"Continuous / one at a time at {streams} streams, each pair measured back to back: "
                + ", ".join(f"{r:.2f}x" for r in ratios)
                + (f"; median **{statistics.median(ratios):.2f}x**." if len(ratios) > 1 else "."),
            ]
    return "\n".join(lines) + "\n"


def bars(loads: list[LoadResult], best_raw: float, device: str) -> list[str]:
    """The service issues' bars for one model, each with this run's figures and whether it holds."""
    at = {(r.server, r.connections): r for r in loads}
    batched = [r for r in loads if r.server.startswith("batching") and r.connections == 64]
    lines = ["Bars (64 clients unless said):", ""]

    def bar(name: str, holds: bool, figures: str) -> None:
        lines.append(f"- {name}: {figures} {'✔' if holds else '✘'}")

    if batched:
        ratios = [r.rps / best_raw for r in batched]
        figures = ", ".join(f"{x:.2f} ({r.server})" for x, r in zip(ratios, batched, strict=True))
        floor = 0.3 if device == "gpu" else 0.9
        bar(f"served ÷ best raw ≥ {floor:g}", max(ratios) >= floor, figures)
    on = at.get(("batching", 64))
    pairs = [  # batching against batch 1 with as many frontends
        (r.rps / off_n.rps, r.server.removeprefix("batching, ") if "frontends" in r.server else "1 frontend")
        for r in batched
        if (off_n := at.get((r.server.replace("batching", "batch-1", 1), 64)))
    ]
    if pairs:
        floor = 10.0 if device == "gpu" else 1.0
        figures = (
            f"{pairs[0][0]:.2f}x"
            if len(pairs) == 1
            else ", ".join(f"{ratio:.2f}x ({processes})" for ratio, processes in pairs)
        )
        bar(f"batching ÷ batch 1 ≥ {floor:g}x", max(p[0] for p in pairs) >= floor, figures)
    several = next((r for r in batched if "frontends" in r.server), None)
    if on and several:
        gain = several.rps / on.rps
        batch = (several.mean_batch or 0) / on.mean_batch if on.mean_batch else 0.0
        bar(
            f"{several.server.removeprefix('batching, ')} ÷ 1: throughput ≥ 1.0x and mean batch ≥ 0.9x",
            gain >= 1.0 and batch >= 0.9,
            f"{gain:.2f}x, batch {batch:.2f}x",
        )
    if on and on.padding_efficiency is not None:
        bar("padding efficiency ≥ 0.85", on.padding_efficiency >= 0.85, f"{on.padding_efficiency:.2f}")
    lone_on, lone_off = at.get(("batching", 1)), at.get(("batch-1", 1))
    if lone_on and lone_off:
        gap = lone_on.p50_ms - lone_off.p50_ms
        bar(
            "1 client: p50 within 1 ms of batch 1",
            gap <= 1.0,
            f"{lone_on.p50_ms:.1f} vs {lone_off.p50_ms:.1f} ms",
        )
    naive = at.get(("naive", 64))
    if on and naive:
        bar("≥ 3x the naive server", on.rps / naive.rps >= 3.0, f"{on.rps / naive.rps:.1f}x")
    bare = at.get((BARE, 64))
    if on and bare:
        best = max(batched, key=lambda r: r.rps)
        bar(
            "served ÷ the bare ASGI server ≥ 0.9",
            best.rps / bare.rps >= 0.9,
            f"{best.rps / bare.rps:.2f} ({best.server}); the bare server (benchmarks/bare_server.py: this "
            f"engine and batcher in one process behind nothing but uvicorn and json) reaches "
            f"{bare.rps / best_raw:.2f} of best raw",
        )
    cpu = [r for r in loads if r.connections == 64 and r.cpu_ms]
    if cpu:
        lines += ["", "CPU per request at 64 clients, ms, by thread (from /proc):", ""]
        for r in cpu:
            assert r.cpu_ms is not None
            lines.append(f"- {r.server}: " + ", ".join(f"{k} {v:.3f}" for k, v in r.cpu_ms.items()))
    return lines


def plot(classification: dict[str, Any], generation: list[dict], out: Path) -> None:
    columns = len(classification) + 1
    with saved_figure(out, (6 * columns, 4.5), columns=columns) as axes:
        for ax, (model, section) in zip(axes, classification.items(), strict=False):
            for server in dict.fromkeys(r.server for r in section["load"]):
                rows = [r for r in section["load"] if r.server == server]
                ax.plot([r.connections for r in rows], [r.rps for r in rows], marker="o", label=server)
            ax.axhline(max(section["raw"].values()), linestyle="--", color="grey", label="best raw engine")
            ax.set_xscale("log", base=2)
            ax.set_xlabel("concurrent clients")
            ax.set_ylabel("requests/s")
            ax.set_title(f"classify: {model}")
            ax.legend()
        ax = axes[-1]
        for engine in ("continuous", "one-at-a-time"):
            by_streams: dict[int, list[float]] = {}
            for g in generation:
                if g["engine"] == engine:
                    by_streams.setdefault(g["streams"], []).append(g["tokens_per_s"])
            streams = sorted(by_streams)
            medians = [statistics.median(by_streams[n]) for n in streams]
            ax.plot(streams, medians, marker="o", label=f"{engine} (median of pairs)")
        ax.set_xlabel("concurrent streams")
        ax.set_ylabel("generated tokens/s")
        ax.set_title("generation")
        ax.legend()


# The two engines compared, each measured right after the other on a fresh server: on a shared 2-core
# machine the speed drifts by up to 1.8x within minutes, so only adjacent measurements make a ratio.
GENERATION_ENGINES: tuple[tuple[str, dict[str, str]], ...] = (
    ("continuous", {}),
    ("one-at-a-time", {"DISTILSERVE_GEN_MAX_BATCH": "1"}),
)
GENERATION_PAIRS = 3  # at 16 streams, where the bar is: the median pair is the figure


def generation_ratios(generation: list[dict], streams: int) -> list[float]:
    """Continuous / one-at-a-time tokens/s of each adjacent pair at `streams`."""
    rates: dict[int, dict[str, float]] = {}
    for g in generation:
        if g["streams"] == streams:
            rates.setdefault(g.get("pair", 0), {})[g["engine"]] = g["tokens_per_s"]
    return [r["continuous"] / r["one-at-a-time"] for _, r in sorted(rates.items()) if len(r) == 2]


@app.command("generation")
def generation_pairs(
    repository: Annotated[Path, typer.Option(help="A repository with the `lm` model.")] = Path("models"),
    streams: Annotated[int, typer.Option(help="Concurrent streams.")] = 16,
    pairs: Annotated[int, typer.Option(help="Alternating continuous / one-at-a-time pairs.")] = 3,
    seconds: Annotated[int, typer.Option(help="Seconds per measurement.")] = 10,
) -> None:
    """Continuous batching vs one at a time, alternating, each on a fresh server: the ratios and spread."""
    ratios = []
    total = pairs * len(GENERATION_ENGINES)
    with ProgressLog.beside(console, "generation bench", total, unit="measurements") as progress_log:
        for i in range(pairs):
            rates = {}
            for engine, env in GENERATION_ENGINES:
                progress_log.update(status=f"pair {i + 1} {engine}")
                with serve(repository, env) as base:
                    g = generation_load(base, "lm", streams, seconds)
                progress_log.update(advance=1)
                rates[engine] = g["tokens_per_s"]
                console.print(
                    f"  pair {i + 1} {engine:>13}: {g['tokens_per_s']:6.0f} tokens/s, TTFT p50 "
                    f"{g['ttft_p50_ms']:.0f} ms, errors {g['errors']}, client CPU {g['client_cpu']:.0%}"
                )
            ratios.append(rates["continuous"] / rates["one-at-a-time"])
    print(f"continuous / one at a time at {streams} streams: " + ", ".join(f"{r:.2f}x" for r in ratios))


BARE = "bare ASGI"  # the ceiling reference (benchmarks/bare_server.py), at 64 clients only


def classification_servers(frontends: int) -> list[tuple[str, dict[str, str]]]:
    """The service configurations each classification model is loaded with, by the name the report uses."""
    one = {"DISTILSERVE_FRONTENDS": "1"}
    servers = [("batching", one), ("batch-1", {**one, "DISTILSERVE_MAX_BATCH_SIZE": "1"})]
    if frontends > 1:  # a pair again: batching's gain is only measured against batch 1 with as many
        several = {"DISTILSERVE_FRONTENDS": str(frontends)}
        servers.append((f"batching, {frontends} frontends", several))
        servers.append((f"batch-1, {frontends} frontends", {**several, "DISTILSERVE_MAX_BATCH_SIZE": "1"}))
    return servers


@app.command("run")
def run(
    repository: Annotated[Path, typer.Option(help="The demo model repository (make models).")] = Path(
        "models"
    ),
    demo: Annotated[Path, typer.Option(help="The demo HF directories (for the naive baseline).")] = Path(
        "build/demo"
    ),
    out: Annotated[Path, typer.Option(help="Directory for http.md, http.json and http.png.")] = Path(
        "docs/bench"
    ),
    seconds: Annotated[int, typer.Option(help="Seconds per load level.")] = 10,
    device: Annotated[
        str, typer.Option(help="cpu or gpu: where the service, engine and baseline run.")
    ] = "cpu",
    work: Annotated[
        Path, typer.Option(help="The benchmark's repository: --repository plus a MiniLM-shaped model.")
    ] = Path("build/bench-models"),
    frontends: Annotated[
        int, typer.Option(help="Also serve with this many HTTP frontends (DISTILSERVE_FRONTENDS); 1: skip.")
    ] = 2,
) -> None:
    """Run every measurement of the service benchmark once and write the report."""
    if device not in ("cpu", "gpu"):
        raise typer.BadParameter("must be cpu or gpu", param_hint="'--device'")
    console.rule("models")
    bench_repo = work
    if bench_repo.resolve() != repository.resolve():  # a prepared one (e.g. carried to a GPU host) is kept
        if bench_repo.exists():
            shutil.rmtree(bench_repo)
        shutil.copytree(repository, bench_repo)
    minilm_shaped(demo, bench_repo)
    os.environ["DISTILSERVE_DEVICE"] = device  # every service this run starts
    if device == "gpu":
        os.environ["DISTILSERVE_REQUIRE_GPU"] = "1"
    bodies = [json.dumps({"inputs": t}) for t in reviews(2000, seed=2)]
    classification: dict[str, Any] = {}
    servers = classification_servers(frontends)
    runs = [
        (streams, pair) for streams in (1, 4, 16) for pair in range(GENERATION_PAIRS if streams == 16 else 1)
    ]
    # What a log is told: per classification model the raw engine, 3 loads per server and the bare server
    # (the demo student's naive baseline 3 more), QA and fill-mask, every generation measurement.
    total = 2 * (2 + 3 * len(servers)) + 3 + 2 + len(runs) * len(GENERATION_ENGINES)
    with ProgressLog.beside(console, "http bench", total, unit="measurements") as progress_log:
        for model, hf_dir in (
            ("sentiment", demo / "text-classification" / "student"),
            ("minilm-shaped", None),
        ):
            console.rule(f"classification: {model}")
            progress_log.update(status=f"classification: {model}")
            version = max((bench_repo / model).iterdir(), key=lambda p: int(p.name))
            raw = raw_engine(version, device)
            progress_log.update(advance=1)
            console.print(f"  raw engine sequences/s: {raw}")
            results = []
            model_body = [json.dumps({"inputs": json.loads(b)["inputs"], "model": model}) for b in bodies]
            for name, env in servers:
                with serve(bench_repo, env) as base:
                    results += [load(name, base, "/v1/classify", model_body, c, seconds) for c in (1, 8, 64)]
                progress_log.update(advance=3)
            with serve(bench_repo, {}, module="benchmarks.bare_server", ready="/v1/models") as base:
                results.append(load(BARE, base, "/v1/classify", model_body, 64, seconds))
            progress_log.update(advance=1)
            if hf_dir is not None:
                with serve_naive(hf_dir, device) as base:
                    results += [load("naive", base, "/v1/classify", bodies, c, seconds) for c in (1, 8, 64)]
                progress_log.update(advance=3)
            classification[model] = {"raw": raw, "load": results}
        others: list[LoadResult] = []
        generation: list[dict] = []
        with serve(bench_repo, {}) as base:
            console.rule("QA and fill-mask")
            progress_log.update(status="QA and fill-mask")
            qa = [json.dumps({"model": "qa", "question": q, "context": CONTEXT}) for q in QUESTIONS]
            masks = [
                json.dumps({"model": "fill-mask", "inputs": t.replace("film", "[MASK]", 1)})
                for t in reviews(500, seed=4)
                if "film" in t
            ]
            for task, path, task_bodies in (("qa", "/v1/qa", qa), ("fill-mask", "/v1/fill-mask", masks)):
                result = load(task, base, path, task_bodies, 8, seconds)
                others.append(result)
                progress_log.update(advance=1)
        console.rule("generation: continuous vs one at a time, alternating")
        progress_log.update(status="generation")
        for streams, pair in runs:
            for engine, env in GENERATION_ENGINES:
                with serve(bench_repo, env) as base:
                    g = generation_load(base, "lm", streams, seconds) | {"engine": engine, "pair": pair}
                progress_log.update(advance=1)
                console.print(
                    f"  {engine} {streams} streams: {g['tokens_per_s']:.0f} tok/s, "
                    f"TTFT p50 {g['ttft_p50_ms']:.0f} ms"
                )
                generation.append(g)
    write_report(out, classification, others, generation, device)


def write_report(
    out: Path, classification: dict[str, Any], others: list[LoadResult], generation: list[dict], device: str
) -> None:
    out.mkdir(parents=True, exist_ok=True)
    (out / "http.md").write_text(render(classification, others, generation, device), encoding="utf-8")
    raw_json = {
        m: {"raw": s["raw"], "load": [asdict(r) for r in s["load"]]} for m, s in classification.items()
    }
    (out / "http.json").write_text(
        json.dumps(
            {
                "device": device,
                "classification": raw_json,
                "others": [asdict(r) for r in others],
                "generation": generation,
            },
            indent=2,
        )
    )
    plot(classification, generation, out / "http.png")
    console.print(f"wrote {out / 'http.md'}, {out / 'http.json'} and {out / 'http.png'}")


@app.command("report")
def report(
    out: Annotated[Path, typer.Option(help="Directory holding http.json.")] = Path("docs/bench"),
) -> None:
    """Write http.md and http.png again from a run's http.json (the same figures, e.g. after the report's
    format changed): nothing is measured."""
    data = json.loads((out / "http.json").read_text(encoding="utf-8"))
    classification = {
        m: {"raw": s["raw"], "load": [LoadResult(**r) for r in s["load"]]}
        for m, s in data["classification"].items()
    }
    others = [LoadResult(**r) for r in data["others"]]
    write_report(out, classification, others, data["generation"], data.get("device", "cpu"))


if __name__ == "__main__":
    app()
