"""The cascade on a served student/teacher pair: quality and the share sent to the teacher on the eval split,
and served throughput against the teacher alone.

    python -m benchmarks.cascade --repository build/real/sst2/models --student sst2 \\
        --eval build/real/sst2/data/eval.jsonl --out docs/bench

One server, the pair as exported (`python -m export ... --teacher-dir`, which calibrates the threshold).
1. Quality: every eval input through /v1/classify (or /v1/qa) three ways, in requests of 32: the student
   alone (cascade_threshold 0), the cascade at its calibrated threshold (the default), the teacher alone.
   Accuracy (QA: F1) of each against the gold labels, the share the cascade sent to the teacher, and the
   cascade's agreement with the teacher.
2. Honesty check: the export calibrated on this same split. Calibrated on its even rows only (from the
   student's and teacher's served answers), the threshold is applied to the odd rows it never saw.
3. Throughput: wrk at `--connections` (64), one input a request, eval inputs drawn at random: the cascade,
   the teacher alone, the student alone, `--seconds` each, side by side on the same server.
A plot: quality against the share sent to the teacher over every threshold, the calibrated point marked, and
the oracle's curve: the least any confidence measure could send with this student (`oracle`).
"""

from __future__ import annotations

import json
import random
from collections.abc import Sequence
from dataclasses import asdict, replace
from pathlib import Path
from typing import Annotated, Any

import httpx
import numpy as np
import typer
from rich.console import Console

from benchmarks.cascade_eval import (
    EvalSet,
    Pass,
    Quality,
    classification_set,
    fewest,
    held_out,
    oracle,
    qa_set,
    sweep,
)
from benchmarks.live_agreement import Live, replay_with_shadows
from benchmarks.plots import saved_axes
from benchmarks.servers import serve
from benchmarks.wrk_load import LoadResult, load
from common.cli import cli_app
from common.progress import ProgressLog

console = Console(stderr=True)
app = cli_app(help=__doc__)
REQUEST_INPUTS = 32


def served_pass(base: str, data: EvalSet, model: str, threshold: float | None, progress: ProgressLog) -> Pass:
    out = Pass([], [], [])
    with httpx.Client(base_url=base, timeout=300) as client:
        for start in range(0, len(data.items), REQUEST_INPUTS):
            chunk = data.items[start : start + REQUEST_INPUTS]
            r = client.post(data.path, json=data.body(chunk, model, threshold))
            r.raise_for_status()
            for answer, score, by in map(data.read, r.json()):
                out.answers.append(answer)
                out.scores.append(score)
                out.models.append(by)
            progress.update(advance=len(chunk))
    return out


def plot(
    points: list[tuple[float, float, float]],
    bound: list[tuple[float, float]],
    quality: Quality,
    name: str,
    metric: str,
    path: Path,
) -> None:
    title = f"{name}: the student's unsure inputs to its teacher"
    xlabel, ylabel = "inputs answered by the teacher (%)", f"{metric} on the eval split (%)"
    with saved_axes(path, (6.4, 4.2), title, xlabel, ylabel, legend_at="lower right") as ax:
        ax.plot([100 * p[1] for p in points], [100 * p[2] for p in points], color="tab:blue", label="cascade")
        ax.plot(
            [100 * f for f, _ in bound],
            [100 * q for _, q in bound],
            color="tab:gray",
            linestyle="-.",
            label="oracle (sends exactly the inputs the teacher does better on)",
        )
        ax.axhline(100 * quality.teacher, color="tab:green", linestyle="--", label="teacher alone")
        ax.axhline(100 * quality.student, color="tab:orange", linestyle=":", label="student alone")
        ax.plot(
            [100 * quality.fallback_rate],
            [100 * quality.cascade],
            "o",
            color="tab:red",
            label=f"served at the calibrated threshold {quality.threshold:.3f}",
        )
        ax.grid(alpha=0.3)


def sample_bodies(data: EvalSet, model: str, threshold: float | None) -> list[str]:
    """Requests of one eval input each, the same 2,000 (at most) for every way measured."""
    rng = random.Random(0)
    return [data.one(item, model, threshold) for item in rng.sample(data.items, min(len(data.items), 2000))]


def throughput(
    base: str,
    data: EvalSet,
    student: str,
    teacher: str,
    connections: int,
    seconds: int,
    thresholds: Sequence[float] = (),
) -> dict[str, LoadResult]:
    ways = {"cascade": (student, None), "teacher alone": (teacher, None), "student alone": (student, 0.0)}
    ways |= {f"cascade at {t:g}": (student, t) for t in thresholds}
    results = {}
    with ProgressLog.beside(console, "throughput", len(ways), unit="ways") as progress:
        for way, (model, threshold) in ways.items():
            progress.update(status=way)
            results[way] = load(
                way, base, data.path, sample_bodies(data, model, threshold), connections, seconds
            )
            progress.update(advance=1)
    return results


def measure_quality(
    base: str, data: EvalSet, student: str, teacher: str, target: float
) -> tuple[Quality, list[tuple[float, float, float]], list[tuple[float, float]]]:
    ways = {"student alone": (student, 0.0), "cascade": (student, None), "teacher alone": (teacher, None)}
    passes = {}
    with ProgressLog.beside(console, "eval passes", len(ways) * len(data.items), unit="inputs") as progress:
        for way, (model, threshold) in ways.items():
            progress.update(status=way)
            passes[way] = served_pass(base, data, model, threshold, progress)
    alone, cascade, by_teacher = passes["student alone"], passes["cascade"], passes["teacher alone"]
    agreement = [a == b for a, b in zip(cascade.answers, by_teacher.answers, strict=True)]
    student_agreement = [a == b for a, b in zip(alone.answers, by_teacher.answers, strict=True)]
    quality = Quality(
        student=data.quality(alone.answers, data.gold),
        cascade=data.quality(cascade.answers, data.gold),
        teacher=data.quality(by_teacher.answers, data.gold),
        fallback_rate=float(np.mean([m == teacher for m in cascade.models])),
        cascade_agreement=float(np.mean(agreement)),
        student_agreement=float(np.mean(student_agreement)),
        threshold=served_threshold(base, student),
        held_out=held_out(data, alone, by_teacher, target),
    )
    return quality, sweep(data, alone, by_teacher), oracle(data, alone, by_teacher)


def served_threshold(base: str, student: str) -> float:
    cards = httpx.get(f"{base}/v1/models", timeout=10).json()["models"]
    card = max((c for c in cards if c["name"] == student), key=lambda c: c["version"])  # the one served
    if card["teacher"] is None or not card["cascade"]["active"]:
        raise typer.BadParameter(
            f"{student} is not served as a pair with an active cascade: {card['cascade']}"
        )
    return float(card["cascade"]["threshold"])


def cost_line(calibration: dict[str, Any]) -> str:
    """What the export's timing says the calibrated cascade costs per input, in teacher passes."""
    cost = calibration.get("student_cost")
    if cost is None:
        return "The export did not time the pair (an export from before `student_cost`)."
    sent = calibration["fallback_rate"]
    total = cost + sent
    direct = ": more than the teacher alone, so the service skips the student there" if total >= 1 else ""
    line = (
        f"The export timed the student at {cost:.2f} of the teacher; the calibrated cascade costs "
        f"{cost:.2f} + {100 * sent:.1f} % sent = {total:.2f} teacher passes an input{direct}."
    )
    paying = calibration.get("paying_limit")
    if paying is not None:
        line += (
            f" A cascade cheaper than the teacher reaches at most {100 * paying['agreement']:.2f} % "
            f"agreement (threshold {paying['threshold']:.4f}, {100 * paying['fallback_rate']:.1f} % sent)."
        )
    return line


def report(
    name: str,
    data: EvalSet,
    quality: Quality,
    speed: dict[str, LoadResult],
    calibration: dict[str, Any],
    connections: int,
) -> str:
    q, m = quality, data.quality_name
    h = q.held_out
    target = calibration["target_agreement"]
    lines = [
        f"# The cascade on {name} ({len(data.items)} eval inputs)",
        "",
        f"Calibrated at export for {target:.0%} agreement with the teacher: threshold {q.threshold:.4f}.",
        cost_line(calibration),
        "",
        f"| way | {m} | sent to the teacher | agreement with the teacher |",
        "|---|---|---|---|",
        f"| student alone | {q.student:.4f} | 0 % | {q.student_agreement:.2%} |",
        f"| cascade (served) | {q.cascade:.4f} | {q.fallback_rate:.1%} | {q.cascade_agreement:.2%} |",
        f"| teacher alone | {q.teacher:.4f} | 100 % | 100 % |",
        "",
        f"Cascade {m} - teacher's: {100 * (q.cascade - q.teacher):+.2f} points.",
        f"Calibrated on the even rows only and applied to the odd rows (threshold {h['threshold']:.4f}): "
        f"{m} {h['cascade']:.4f} against the teacher's {h['teacher']:.4f} "
        f"({100 * (h['cascade'] - h['teacher']):+.2f} points), {h['fallback_rate']:.1%} sent to the teacher, "
        f"agreement {h['agreement']:.2%}.",
        "",
        f"Served throughput at {connections} connections, one input a request:",
        "",
        "| way | requests/s | p50 ms | p99 ms | errors | mean batch |",
        "|---|---|---|---|---|---|",
    ]
    for way, r in speed.items():
        batch = "-" if r.mean_batch is None else f"{r.mean_batch:.1f}"
        lines.append(f"| {way} | {r.rps:.0f} | {r.p50_ms:.1f} | {r.p99_ms:.1f} | {r.errors} | {batch} |")
    ratio = speed["cascade"].rps / speed["teacher alone"].rps
    lines += ["", f"Cascade ÷ teacher alone: {ratio:.2f}x requests/s.", ""]
    return "\n".join(lines)


def live_report(live: Live, alone: LoadResult, quality: Quality) -> str:
    offline = "not recorded" if live.offline is None else f"{live.offline:.2%}"
    lines = [
        "",
        "Live agreement: the eval split replayed with DISTILSERVE_SHADOW_RATE=1 (cascade off): "
        f"{live.compared:.0f} student answers checked by the teacher, {live.dropped:.0f} dropped; live "
        f"agreement {live.agreement:.2%} against {offline} in the distillation report "
        f"(and {quality.student_agreement:.2%} from the served student and teacher answered apart).",
    ]
    if live.under_load is not None:
        r = live.under_load
        lines.append(
            f"Under load ({r.connections} connections) with shadow rate 1: {r.rps:.0f} requests/s, p50 "
            f"{r.p50_ms:.1f} ms, p99 {r.p99_ms:.1f} ms, {r.errors} errors, {live.checked_under_load:.0f} "
            f"answers checked and {live.dropped_under_load:.0f} dropped; the student alone without "
            f"shadows: {alone.rps:.0f} requests/s, p50 {alone.p50_ms:.1f}, p99 {alone.p99_ms:.1f} ms."
        )
    return "\n".join(lines) + "\n"


@app.command()
def main(
    repository: Annotated[Path, typer.Option(help="Model repository holding the pair.")],
    student: Annotated[str, typer.Option(help="The student's name; its manifest names the teacher.")],
    eval_data: Annotated[
        Path, typer.Option("--eval", help="The eval split (.jsonl classification, SQuAD .json).")
    ],
    out: Annotated[Path, typer.Option(help="Directory for the report, its JSON and plot.")] = Path(
        "docs/bench"
    ),
    connections: Annotated[int, typer.Option(min=1)] = 64,
    seconds: Annotated[int, typer.Option(min=1, help="wrk seconds per way.")] = 20,
    limit: Annotated[int, typer.Option(min=1, help="Eval inputs used, the first N.")] = 100_000,
    thresholds: Annotated[
        str, typer.Option(help="Comma list of other thresholds whose served throughput is measured too.")
    ] = "",
) -> None:
    """Quality, share sent to the teacher and served throughput of a student/teacher pair's cascade."""
    data = qa_set(eval_data) if eval_data.suffix == ".json" else classification_set(eval_data)
    data = replace(data, items=data.items[:limit], gold=data.gold[:limit])
    manifest = json.loads(
        max((repository / student).glob("*/manifest.json"), key=lambda p: int(p.parent.name)).read_text()
    )
    teacher, target = manifest["teacher"]["name"], manifest["cascade"]["target_agreement"]
    offline = (manifest.get("distillation") or {}).get("agreement")
    with serve(repository, {}) as base:
        served_threshold(base, student)  # refuse before measuring anything
        quality, points, bound = measure_quality(base, data, student, teacher, target)
        extra = [float(t) for t in thresholds.split(",") if t.strip()]
        speed = throughput(base, data, student, teacher, connections, seconds, extra)
    chunks = [data.items[i : i + REQUEST_INPUTS] for i in range(0, len(data.items), REQUEST_INPUTS)]
    requests = [(data.body(chunk, student, None), len(chunk)) for chunk in chunks]
    bodies = sample_bodies(data, student, None)
    live = replay_with_shadows(repository, data.path, requests, bodies, offline, connections, seconds)
    out.mkdir(parents=True, exist_ok=True)
    text = report(student, data, quality, speed, manifest["cascade"], connections)
    text += fewest(points, bound, quality, data)
    text += live_report(live, speed["student alone"], quality)
    (out / f"cascade-{student}.md").write_text(text, encoding="utf-8")
    record = {
        "quality": asdict(quality),
        "throughput": {k: asdict(v) for k, v in speed.items()},
        "live": asdict(live),
        "sweep": [{"threshold": t, "to_teacher": f, data.quality_name: q} for t, f, q in points],
        "oracle": [{"to_teacher": f, data.quality_name: q} for f, q in bound],
    }
    (out / f"cascade-{student}.json").write_text(json.dumps(record, indent=2) + "\n", encoding="utf-8")
    plot(points, bound, quality, student, data.quality_name, out / f"cascade-{student}.png")
    print(text)


if __name__ == "__main__":
    app()
