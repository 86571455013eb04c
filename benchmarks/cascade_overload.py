"""The cascade under more load than its pair can carry: what clients get when the teacher cannot take the
inputs its student is unsure of (service.cascade, `Pairs.from_teacher`).

    python -m benchmarks.cascade_overload --repository build/real/sst2/models --student sst2 \\
        --eval build/real/sst2/data/eval.jsonl --loads 0.5,1,1.5,2 --modes refuse,student,budget:50

First, on one server: the teacher's answer to every eval input (what agreement is counted against) and
the cascade's capacity, the requests/s it serves with `--capacity-connections` requests always in flight
(wrk, a closed loop). Then, per load (a multiple of that capacity) and mode, a fresh server and an
open loop (benchmarks.open_loop: Poisson arrivals, one eval input a request drawn at random,
`--seconds` after a warm-up, up to `--connections` at once) with:
- `refuse`: DISTILSERVE_CASCADE_OVERLOAD=refuse, as the service was before: the teacher's 429s (its queue
  full) and 504s (the request's deadline) reach clients whose student had answered;
- `student` (the default): the student's answers stand where the teacher's queue is full or the deadline
  passed;
- `budget:MS`: and where the teacher has not answered within MS (DISTILSERVE_CASCADE_BUDGET_MS);
- `split:MS`: two kinds of client on one pair, as `student` serves them: half the requests bring their own
  `cascade_budget_ms` of MS (a client that wants an answer fast), half none (one that wants the teacher's
  where the student is unsure); each half is a point of its own ("split:MS budget", "split:MS none");
- `first:MS`: the same two kinds, the hurried half also with `priority: -1`, ahead in the queues.
Per point: the share answered (200) and the rest by status; p50 and p99 of every request (an error at the
time it came back); over the answered ones, agreement with the teacher alone, quality (accuracy; QA: F1), the
share the teacher answered and the share kept (the student's answer below the threshold: the teacher was
busy). The client shares the server's cores: say so beside a figure.
"""

from __future__ import annotations

import json
from collections import Counter
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console

from benchmarks.cascade import served_pass, served_threshold
from benchmarks.cascade_eval import EvalSet, classification_set, qa_set
from benchmarks.open_loop import Reply, latency_ms, open_loop
from benchmarks.plots import saved_figure
from benchmarks.servers import serve
from benchmarks.wrk_load import load as wrk_load
from common.cli import cli_app
from common.progress import ProgressLog

console = Console(stderr=True)
SPLIT_MODES = ("split:", "first:")  # two kinds of client on one server
app = cli_app(help=__doc__)


@dataclass(frozen=True)
class Point:
    """One mode at one offered load."""

    mode: str
    load: float  # offered ÷ capacity
    offered_rps: float
    requests: int
    answered: float  # share with a 200
    statuses: dict[str, int]  # the others, by status ("0": the connection failed)
    p50_ms: float
    p99_ms: float
    agreement: float  # answered ones: the teacher's own answer
    quality: float
    by_teacher: float  # answered ones: the teacher gave the answer
    kept: float  # answered ones: the student's answer, below the threshold (the teacher was busy)


def mode_env(mode: str) -> dict[str, str]:
    """A mode's server settings."""
    if mode == "refuse":
        return {"DISTILSERVE_CASCADE_OVERLOAD": "refuse"}
    if mode == "student":
        return {"DISTILSERVE_CASCADE_OVERLOAD": "student"}
    if mode.startswith("budget:"):
        ms = f"{budget(mode):g}"
        return {"DISTILSERVE_CASCADE_OVERLOAD": "student", "DISTILSERVE_CASCADE_BUDGET_MS": ms}
    if mode.startswith(SPLIT_MODES):
        budget(mode)
        return {"DISTILSERVE_CASCADE_OVERLOAD": "student"}
    raise typer.BadParameter(
        f"unknown mode {mode!r}: refuse, student, budget:MS, split:MS or first:MS", param_hint="--modes"
    )


def budget(mode: str) -> float:
    """The MS of `budget:MS`, `split:MS` and `first:MS`: a positive number of milliseconds."""
    try:
        found = float(mode.split(":", 1)[1])
    except ValueError:
        found = 0.0
    if found <= 0:
        raise typer.BadParameter(f"{mode!r}: the budget is a positive number of ms", param_hint="--modes")
    return found


def request_bodies(data: EvalSet, student: str, mode: str) -> list[str]:
    """One body per eval input; for `split:MS` and `first:MS`, then each again with its own budget of MS
    (and for `first:`, priority -1): the second half, a reply's `body` // the inputs is its kind of client."""
    plain = [data.one(item, student, None) for item in data.items]
    if not mode.startswith(SPLIT_MODES):
        return plain
    hurry: dict[str, float] = {"cascade_budget_ms": budget(mode)}
    if mode.startswith("first:"):
        hurry["priority"] = -1
    hurried = [json.dumps(json.loads(b) | hurry) for b in plain]
    return plain + hurried


def points_of(
    mode: str,
    load: float,
    rate: float,
    replies: list[Reply],
    data: EvalSet,
    teacher_answers: list[str],
    student: str,
    threshold: float,
) -> list[Point]:
    """One run's point, or a `split:`/`first:` run's two: the clients with a budget, and those without."""
    n = len(data.items)
    if not mode.startswith(SPLIT_MODES):
        return [point(mode, load, rate, replies, data, teacher_answers, student, threshold)]
    kinds = (("none", [r for r in replies if r.body < n]), ("budget", [r for r in replies if r.body >= n]))
    return [
        point(f"{mode} {kind}", load, rate / 2, mine, data, teacher_answers, student, threshold)
        for kind, mine in kinds
    ]


def server_settings(env: str) -> dict[str, str]:
    """`--env`'s K=V,K=V."""
    pairs = [kv.strip() for kv in env.split(",") if kv.strip()]
    bad = [kv for kv in pairs if "=" not in kv]
    if bad:
        raise typer.BadParameter(f"{bad[0]!r}: give K=V, e.g. DISTILSERVE_MAX_QUEUE=128", param_hint="--env")
    return dict(kv.split("=", 1) for kv in pairs)


def multiples(loads: str) -> list[float]:
    """`--loads`: positive multiples of the capacity."""
    try:
        found = [float(x) for x in loads.split(",") if x.strip()]
    except ValueError:
        found = []
    if not found or any(x <= 0 for x in found):
        raise typer.BadParameter(f"{loads!r}: give positive numbers, e.g. 0.5,1,2", param_hint="--loads")
    return found


def point(
    mode: str,
    load: float,
    offered_rps: float,
    replies: list[Reply],
    data: EvalSet,
    teacher_answers: list[str],
    student: str,
    threshold: float,
) -> Point:
    """What the clients of one run got (a reply's `body` modulo the eval inputs is its input)."""
    n = len(data.items)
    answered = [r for r in replies if r.status == 200]
    read = [data.read(json.loads(r.answer)) for r in answered]
    answers = [answer for answer, _, _ in read]
    agreed = [answer == teacher_answers[r.body % n] for answer, r in zip(answers, answered, strict=True)]
    quality = data.quality(answers, [data.gold[r.body % n] for r in answered]) if answered else 0.0
    latency = latency_ms([r.latency_s for r in replies])
    teacher = sum(by != student for _, _, by in read)
    kept = sum(by == student and score < threshold for _, score, by in read)
    share = len(answered) or 1
    return Point(
        mode=mode,
        load=load,
        offered_rps=offered_rps,
        requests=len(replies),
        answered=len(answered) / max(1, len(replies)),
        statuses=dict(Counter(str(r.status) for r in replies if r.status != 200)),
        p50_ms=latency["p50_ms"],
        p99_ms=latency["p99_ms"],
        agreement=sum(agreed) / share,
        quality=quality,
        by_teacher=teacher / share,
        kept=kept / share,
    )


def report(points: list[Point], capacity: float, data: EvalSet, student: str, seconds: float) -> str:
    lines = [
        f"# The cascade past its capacity: {student}, {len(data.items)} eval inputs",
        "",
        f"Capacity: {capacity:.0f} requests/s (one input each). Open loop, Poisson arrivals, {seconds:g} s a "
        "point on a fresh server; the client shares the server's cores.",
        "",
        f"| mode | load | offered req/s | answered | errors | p50 ms | p99 ms | agrees with teacher | "
        f"{data.quality_name} | by teacher | kept (teacher busy) |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for p in points:
        errors = ", ".join(f"{n}x{status}" for status, n in sorted(p.statuses.items())) or "0"
        lines.append(
            f"| {p.mode} | {p.load:g}x | {p.offered_rps:.0f} | {100 * p.answered:.1f} % | {errors} | "
            f"{p.p50_ms:.0f} | {p.p99_ms:.0f} | {100 * p.agreement:.2f} % | {p.quality:.4f} | "
            f"{100 * p.by_teacher:.1f} % | {100 * p.kept:.1f} % |"
        )
    return "\n".join(lines) + "\n"


def plot(points: list[Point], out: Path, student: str) -> None:
    with saved_figure(out, (11, 3.8), columns=3) as (latency, answered, agreement):
        for mode in dict.fromkeys(p.mode for p in points):
            mine = [p for p in points if p.mode == mode]
            loads = [p.load for p in mine]
            latency.plot(loads, [p.p99_ms for p in mine], marker="o", label=mode)
            answered.plot(loads, [100 * p.answered for p in mine], marker="o", label=mode)
            agreement.plot(loads, [100 * p.agreement for p in mine], marker="o", label=mode)
        latency.set_yscale("log")
        for axis, title, ylabel in (
            (latency, f"{student}: p99 latency", "p99 ms (log)"),
            (answered, "requests answered (200)", "%"),
            (agreement, "answers agreeing with the teacher", "%"),
        ):
            axis.set_title(title)
            axis.set_xlabel("offered load ÷ the cascade's capacity")
            axis.set_ylabel(ylabel)
            axis.legend(fontsize=8)


@app.command()
def main(
    repository: Annotated[Path, typer.Option(help="A repository serving the pair.")],
    student: Annotated[str, typer.Option(help="The student's name.")],
    eval_data: Annotated[Path, typer.Option("--eval", help="Its eval split (JSONL, or SQuAD for QA).")],
    loads: Annotated[str, typer.Option(help="Offered loads, as multiples of the capacity.")] = "0.5,1,1.5,2",
    modes: Annotated[
        str, typer.Option(help="refuse, student, budget:MS, split:MS, first:MS.")
    ] = "refuse,student,budget:50",
    seconds: Annotated[float, typer.Option(min=1)] = 15,
    connections: Annotated[int, typer.Option(min=1, help="Most requests in flight at once.")] = 512,
    capacity_connections: Annotated[int, typer.Option(min=1)] = 64,
    env: Annotated[str, typer.Option(help="More server settings, K=V,K=V (every point).")] = "",
    out: Annotated[Path, typer.Option()] = Path("docs/bench"),
) -> None:
    data = qa_set(eval_data) if eval_data.suffix == ".json" else classification_set(eval_data)
    common, offered, chosen = server_settings(env), multiples(loads), [m.strip() for m in modes.split(",")]
    for mode in chosen:
        mode_env(mode)  # an unknown one is refused before anything runs
    bodies = request_bodies(data, student, "student")  # one body an input, for the capacity
    with serve(repository, common) as base:
        threshold = served_threshold(base, student)
        teacher = f"{student}-teacher"
        with ProgressLog.beside(console, "teacher's answers", len(data.items), unit="inputs") as progress:
            teacher_answers = served_pass(base, data, teacher, None, progress).answers
        wrk_load("warm-up", base, data.path, bodies, capacity_connections, 3)
        capacity = wrk_load("capacity", base, data.path, bodies, capacity_connections, int(seconds)).rps
    console.print(f"capacity {capacity:.0f} requests/s at {capacity_connections} connections")
    points: list[Point] = []
    for load in offered:
        for mode in chosen:
            rate = load * capacity
            sent = request_bodies(data, student, mode)
            with serve(repository, {**common, **mode_env(mode)}) as base:
                open_loop(base, data.path, sent, min(rate, capacity / 2), 3, connections)  # warm-up
                replies: list[Reply] = []
                open_loop(base, data.path, sent, rate, seconds, connections, replies)
            found = points_of(mode, load, rate, replies, data, teacher_answers, student, threshold)
            points.extend(found)
            for line in report(found, capacity, data, student, seconds).splitlines()[-len(found) :]:
                print(line, flush=True)
    text = report(points, capacity, data, student, seconds)
    out.mkdir(parents=True, exist_ok=True)
    stem = out / f"cascade-overload-{student}"
    stem.with_suffix(".md").write_text(text, encoding="utf-8")
    payload = {"capacity_rps": capacity, "threshold": threshold, "points": [asdict(p) for p in points]}
    stem.with_suffix(".json").write_text(json.dumps(payload, indent=1), encoding="utf-8")
    plot(points, stem.with_suffix(".png"), student)
    print(text)


if __name__ == "__main__":
    app()
