"""The student learns the traffic it serves: capture what its teacher answers, distil again, serve again.

    python -m benchmarks.traffic_loop split --stsb ../shared/data/stsb_train.tsv --out build/loop
    python -m benchmarks.traffic_loop capture --repository build/real/sst2/models --student sst2 \\
        --traffic build/loop/traffic.txt --capture build/loop/capture
    python -m training traffic build/loop/capture --train build/real/sst2/data/train.jsonl \\
        --eval build/loop/heldout.txt --original-rows 6000 --out build/loop/train.jsonl
    python -m training distill --student-init build/real/sst2/student --train build/loop/train.jsonl ...
    python -m export ... --teacher sst2-teacher:1     # the next version of sst2, paired again
    python -m benchmarks.traffic_loop measure --repository build/real/sst2/models --student sst2:1 \\
        --student sst2:2 --student sst2:3 --traffic build/loop/heldout.txt \\
        --eval build/real/sst2/data/eval.jsonl --out docs/bench

`split`: the traffic, texts of another domain than the student was distilled on (STS-B's sentences: news,
captions, forums, against SST-2's film reviews), cut into what is served and captured, and held-out texts
that neither lie inside a captured one nor contain one.
`capture`: one server, the pair as exported (the cascade at its calibrated threshold, every answer the
student keeps checked by the teacher: DISTILSERVE_SHADOW_RATE=1), DISTILSERVE_CAPTURE_DIR set; the traffic
in requests of 32, each sent once the last one's checks are done (none dropped), so every input's teacher
answer is kept. Live agreement on the traffic is counted on the way.
`measure`: one server, every student version asked by version: on the held-out traffic and on the labelled
eval split, the student alone, the teacher alone and the cascade at the version's calibrated threshold;
agreement with the teacher, the share the cascade sends, accuracy on the eval split; then the cascade's
requests/s on the held-out traffic under wrk, one version after another. A table, JSON and a plot.
"""

from __future__ import annotations

import json
import random
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Annotated, Any

import httpx
import typer
from rich.console import Console

from benchmarks.plots import saved_figure
from benchmarks.servers import serve
from benchmarks.wrk_load import load, metric_totals
from common.cli import cli_app
from common.progress import ProgressLog

console = Console(stderr=True)
app = cli_app(help=__doc__)
REQUEST_INPUTS = 32


@app.command()
def split(
    stsb: Annotated[
        Path, typer.Option(exists=True, dir_okay=False, help="STS-B's TSV (sentence1, sentence2).")
    ],
    out: Annotated[Path, typer.Option(file_okay=False, help="Writes traffic.txt and heldout.txt here.")],
    traffic: Annotated[int, typer.Option(min=1, help="Texts served and captured.")] = 6000,
    heldout: Annotated[int, typer.Option(min=1, help="Texts held out for measuring.")] = 2000,
    seed: int = 0,
) -> None:
    """Unique sentences, shuffled; held out first, then the traffic minus any text that lies inside a
    held-out one or contains one."""
    from training.traffic import words_of

    lines = stsb.read_text(encoding="utf-8").splitlines()
    columns = lines[0].split("\t")
    a, b = columns.index("sentence1"), columns.index("sentence2")
    seen: dict[str, None] = {}
    for line in lines[1:]:
        fields = line.split("\t")
        for text in (fields[a], fields[b]):
            if text.strip():
                seen.setdefault(" ".join(text.split()), None)
    texts = list(seen)
    random.Random(seed).shuffle(texts)
    held = texts[:heldout]
    padded = [words_of(t) for t in held]
    served = []
    for text in texts[heldout:]:
        mine = words_of(text)
        if not any(mine in h or h in mine for h in padded):
            served.append(text)
        if len(served) == traffic:
            break
    out.mkdir(parents=True, exist_ok=True)
    (out / "traffic.txt").write_text("".join(t + "\n" for t in served), encoding="utf-8")
    (out / "heldout.txt").write_text("".join(t + "\n" for t in held), encoding="utf-8")
    console.print(f"{len(texts)} unique sentences: {len(served)} traffic, {len(held)} held out -> {out}")


def _texts(path: Path) -> list[str]:
    return [line.strip() for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]


@app.command()
def capture(
    repository: Annotated[Path, typer.Option(exists=True, file_okay=False)],
    student: Annotated[str, typer.Option(help="The served student, its highest version.")],
    traffic: Annotated[Path, typer.Option(exists=True, dir_okay=False, help="A text a line.")],
    capture_dir: Annotated[Path, typer.Option("--capture", file_okay=False, help="DISTILSERVE_CAPTURE_DIR.")],
) -> None:
    """Serve the traffic to the pair with capture on; every input's teacher answer is kept."""
    texts = _texts(traffic)
    env = {"DISTILSERVE_SHADOW_RATE": "1.0", "DISTILSERVE_CAPTURE_DIR": str(capture_dir.resolve())}
    with serve(repository, env) as base:
        replay(base, texts, {"model": student}, "served and captured")
        t = metric_totals(base)
    compared = t.get("distilserve_shadow_compared_total", 0.0)
    agreed = t.get("distilserve_shadow_agreed_total", 0.0)
    fallbacks = t.get("distilserve_cascade_fallbacks_total", 0.0)
    console.print(
        f"{len(texts)} inputs: {fallbacks:.0f} sent to the teacher by the cascade, {compared:.0f} checked "
        f"(live agreement {agreed / max(compared, 1):.4f}), "
        f"{t.get('distilserve_shadow_dropped_total', 0.0):.0f} dropped; "
        f"{t.get('distilserve_capture_records_total', 0.0):.0f} records kept under {capture_dir}, "
        f"{t.get('distilserve_capture_dropped_total', 0.0):.0f} dropped"
    )


_SETTLED = ("cascade_fallbacks", "shadow_compared", "shadow_dropped")


def replay(base: str, texts: list[str], asking: dict[str, Any], what: str) -> None:
    """`texts` at the default threshold, 32 a request, each request once the one before has settled: every
    input sent to the teacher or checked by it (or dropped; at a shadow rate below 1, once those counts stop
    moving), so the teacher's answers are all seen and none competes with the next request."""

    def settled() -> float:
        t = metric_totals(base)
        return sum(t.get(f"distilserve_{n}_total", 0.0) for n in _SETTLED)

    start_at = settled()
    with (
        ProgressLog.beside(console, what, len(texts), unit="inputs") as progress,
        httpx.Client(base_url=base, timeout=300) as client,
    ):
        for start in range(0, len(texts), REQUEST_INPUTS):
            chunk = texts[start : start + REQUEST_INPUTS]
            client.post("/v1/classify", json={"inputs": chunk, **asking}).raise_for_status()
            deadline, last, still = time.monotonic() + 30, -1.0, 0
            while time.monotonic() < deadline:
                now = settled()
                if now - start_at >= start + len(chunk) or still >= 5:
                    break
                still = still + 1 if now == last else 0
                last = now
                time.sleep(0.01)
            progress.update(advance=len(chunk))


@dataclass
class VersionFigures:
    """One student version, measured beside its teacher."""

    version: int
    threshold: float
    traffic_agreement: float  # the student alone, the teacher's best label, held-out traffic
    traffic_sent: float  # the share the cascade sent to the teacher there
    traffic_cascade_agreement: float
    eval_accuracy: float  # the student alone, gold labels
    eval_agreement: float
    eval_sent: float
    eval_cascade_accuracy: float
    cascade_rps: float | None = None  # the cascade on held-out traffic, wrk
    teacher_rps: float | None = None


def _labels(
    client: httpx.Client, texts: list[str], model: str, version: int | None, threshold: float | None
) -> tuple[list[str], list[str]]:
    """Each text's best label and the model that gave it."""
    labels, by = [], []
    for start in range(0, len(texts), REQUEST_INPUTS):
        body: dict[str, Any] = {"inputs": texts[start : start + REQUEST_INPUTS], "model": model}
        if version is not None:
            body["version"] = version
        if threshold is not None:
            body["cascade_threshold"] = threshold
        r = client.post("/v1/classify", json=body)
        r.raise_for_status()
        for row in r.json():
            labels.append(row[0]["label"])
            by.append(row[0]["model"])
    return labels, by


def name_version(value: str) -> tuple[str, int]:
    """`--student`'s name:version, or a message that says what it takes."""
    name, _, version = value.partition(":")
    if not name or not version.isdigit():
        raise typer.BadParameter(f"{value!r}: give name:version, e.g. sst2:2", param_hint="--student")
    return name, int(version)


def _mean(flags: list[bool]) -> float:
    return sum(flags) / len(flags) if flags else float("nan")


@app.command()
def measure(
    repository: Annotated[Path, typer.Option(exists=True, file_okay=False)],
    student: Annotated[list[str], typer.Option(help="name:version, once per version to measure.")],
    traffic: Annotated[
        Path, typer.Option(exists=True, dir_okay=False, help="Held-out traffic, a text a line.")
    ],
    eval_file: Annotated[
        Path, typer.Option("--eval", exists=True, dir_okay=False, help="Labelled eval split.")
    ],
    out: Annotated[Path, typer.Option(file_okay=False)] = Path("docs/bench"),
    connections: int = 64,
    seconds: Annotated[int, typer.Option(help="wrk per version (0: no throughput).")] = 10,
    variant: Annotated[
        str,
        typer.Option(
            help="DISTILSERVE_VARIANT: one for every model, so versions whose export kept "
            "different int8 recipes compare as trained."
        ),
    ] = "fp32",
    live: Annotated[
        bool, typer.Option(help="DISTILSERVE_CASCADE_CALIBRATION=live: thresholds calibrated as they serve.")
    ] = False,
    shadow_rate: Annotated[
        float, typer.Option(help="DISTILSERVE_SHADOW_RATE (live calibration's sample).")
    ] = 0.0,
    warm_up: Annotated[
        Path | None,
        typer.Option(exists=True, dir_okay=False, help="Traffic each version serves first (a text a line)."),
    ] = None,
) -> None:
    from training.data.loaders import load_classification

    texts = _texts(traffic)
    data = load_classification(eval_file)
    eval_texts = [e.text for e in data.examples]
    gold = [data.label_names[e.label] for e in data.examples]
    versions = [name_version(s) for s in student]
    name = versions[0][0]
    figures: list[VersionFigures] = []
    env = {
        "DISTILSERVE_SHADOW_RATE": str(shadow_rate),
        "DISTILSERVE_VARIANT": variant,
        "DISTILSERVE_CASCADE_CALIBRATION": "live" if live else "export",
    }
    with serve(repository, env) as base, httpx.Client(base_url=base, timeout=300) as client:
        warm = _texts(warm_up) if warm_up is not None else []
        for model, version in versions if warm else ():
            replay(base, warm, {"model": model, "version": version}, f"warm-up v{version}")
        cards = {(c["name"], c["version"]): c for c in client.get("/v1/models").json()["models"]}
        teacher = cards[versions[0]]["teacher"]["name"]
        total = (len(texts) + len(eval_texts)) * (1 + 2 * len(versions))
        with ProgressLog.beside(console, "passes", total, unit="inputs") as progress:
            by_teacher = _labels(client, texts, teacher, None, None)[0]
            eval_teacher = _labels(client, eval_texts, teacher, None, None)[0]
            progress.update(advance=len(texts) + len(eval_texts))
            for model, version in versions:
                threshold = float(cards[(model, version)]["cascade"]["threshold"])
                alone = _labels(client, texts, model, version, 0.0)[0]
                cascade, cascade_by = _labels(client, texts, model, version, None)
                eval_alone = _labels(client, eval_texts, model, version, 0.0)[0]
                eval_cascade, eval_by = _labels(client, eval_texts, model, version, None)
                progress.update(advance=2 * (len(texts) + len(eval_texts)))
                figures.append(
                    VersionFigures(
                        version=version,
                        threshold=threshold,
                        traffic_agreement=_mean([a == t for a, t in zip(alone, by_teacher, strict=True)]),
                        traffic_sent=_mean([m == teacher for m in cascade_by]),
                        traffic_cascade_agreement=_mean(
                            [a == t for a, t in zip(cascade, by_teacher, strict=True)]
                        ),
                        eval_accuracy=_mean([a == g for a, g in zip(eval_alone, gold, strict=True)]),
                        eval_agreement=_mean([a == t for a, t in zip(eval_alone, eval_teacher, strict=True)]),
                        eval_sent=_mean([m == teacher for m in eval_by]),
                        eval_cascade_accuracy=_mean(
                            [a == g for a, g in zip(eval_cascade, gold, strict=True)]
                        ),
                    )
                )
        teacher_accuracy = _mean([a == g for a, g in zip(eval_teacher, gold, strict=True)])
        if seconds > 0:
            sample = random.Random(0).sample(texts, min(len(texts), 2000))
            teacher_bodies = [json.dumps({"inputs": t, "model": teacher}) for t in sample]
            for f in figures:
                bodies = [json.dumps({"inputs": t, "model": name, "version": f.version}) for t in sample]
                f.teacher_rps = load(
                    "teacher alone", base, "/v1/classify", teacher_bodies, connections, seconds
                ).rps
                f.cascade_rps = load(f"v{f.version}", base, "/v1/classify", bodies, connections, seconds).rps
    out.mkdir(parents=True, exist_ok=True)
    stem = out / f"traffic-loop-{name}"
    result = {
        "teacher": teacher,
        "teacher_eval_accuracy": teacher_accuracy,
        "versions": [asdict(f) for f in figures],
    }
    Path(f"{stem}.json").write_text(json.dumps(result, indent=2) + "\n", encoding="utf-8")
    _plot(figures, Path(f"{stem}.png"), name)
    report = _report(
        figures, name, teacher, teacher_accuracy, len(texts), len(eval_texts), connections, variant
    )
    Path(f"{stem}.md").write_text(report, encoding="utf-8")
    print(report)


def _report(
    figures: list[VersionFigures],
    name: str,
    teacher: str,
    teacher_accuracy: float,
    traffic: int,
    evals: int,
    connections: int,
    variant: str,
) -> str:
    lines = [
        f"# {name}: the student learns the traffic it serves",
        "",
        f"Held-out traffic: {traffic} texts; eval split: {evals} labelled texts (the teacher {teacher}: "
        f"accuracy {teacher_accuracy:.4f}); every model served {variant}. Cascade at each version's "
        f"calibrated threshold; requests/s at {connections} connections on the held-out traffic, one text a "
        "request, the teacher's measured just before each version's.",
        "",
        "| version | threshold | traffic: agreement | traffic: sent | traffic: cascade agreement | eval: "
        "accuracy | eval: agreement | eval: sent | eval: cascade accuracy | cascade ÷ teacher req/s |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for f in figures:
        speed = (
            f"{f.cascade_rps / f.teacher_rps:.2f}x ({f.cascade_rps:.0f} / {f.teacher_rps:.0f})"
            if f.cascade_rps and f.teacher_rps
            else "-"
        )
        lines.append(
            f"| {f.version} | {f.threshold:.4f} | {f.traffic_agreement:.2%} | {f.traffic_sent:.1%} | "
            f"{f.traffic_cascade_agreement:.2%} | {f.eval_accuracy:.4f} | {f.eval_agreement:.2%} | "
            f"{f.eval_sent:.1%} | {f.eval_cascade_accuracy:.4f} | {speed} |"
        )
    return "\n".join(lines) + "\n"


def _plot(figures: list[VersionFigures], out: Path, name: str) -> None:
    labels = [f"v{f.version}" for f in figures]
    with saved_figure(out, (9, 3.6), columns=2) as (left, right):
        x = range(len(figures))
        left.bar(
            [i - 0.2 for i in x], [100 * f.traffic_agreement for f in figures], 0.4, label="held-out traffic"
        )
        left.bar([i + 0.2 for i in x], [100 * f.eval_agreement for f in figures], 0.4, label="eval split")
        left.set_xticks(list(x), labels)
        left.set_ylabel("agreement with the teacher (%)")
        left.set_ylim(min(100 * min(f.traffic_agreement, f.eval_agreement) for f in figures) - 5, 100)
        left.set_title(f"{name}: the student alone")
        left.legend(fontsize=8)
        right.bar(
            [i - 0.2 for i in x], [100 * f.traffic_sent for f in figures], 0.4, label="held-out traffic"
        )
        right.bar([i + 0.2 for i in x], [100 * f.eval_sent for f in figures], 0.4, label="eval split")
        right.set_xticks(list(x), labels)
        right.set_ylabel("sent to the teacher (%)")
        right.set_title("the cascade at its calibrated threshold")
        right.legend(fontsize=8)


if __name__ == "__main__":
    app()
