"""Causal-LM students side by side: perplexity ÷ the teacher's at each block length `eval-lm` scored them.

    python -m benchmarks.lm_students --out docs/bench/smollm2-students \\
        "v4: even 10=build/real/smollm2/student-gpu-generated/lm_eval-gpu-all-valid.json" \\
        "v5: circuit 12=build/real/smollm2/student-induct12/lm_eval-256.json,build/.../lm_eval-2048.json"

Each argument is LABEL=FILE[,FILE...], the files `eval-lm` wrote (lm_eval.json, or the lm_eval-SIZE.json
the device script keeps per block size). Writes OUT.md (a table) and OUT.png (the ratio per block length,
one bar per student): a student that only learned short context shows a tall bar at the long length. Where
a file has eval-lm's ratio per window of positions (`by_position`), the longest block's windows get a
second table and a second panel: how far into its context each student falls behind.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import typer

from benchmarks.plots import saved_figure
from common.cli import line_console

app = typer.Typer(add_completion=False)


Scores = dict[int, dict[str, Any]]  # per block size: ratio, perplexities, agreement, blocks, by_position


def read_scores(spec: str) -> tuple[str, Scores]:
    """LABEL=FILE[,FILE...] -> the label and, per block size, that file's ratio, perplexities, agreement."""
    label, _, files = spec.partition("=")
    if not label or not files:
        raise typer.BadParameter(f"expected LABEL=FILE[,FILE...], got {spec!r}")
    scores: Scores = {}
    for name in files.split(","):
        try:
            summary = json.loads(Path(name).read_text())
            scores[int(summary["block_size"])] = {
                "ratio": summary["perplexity_ratio"],
                "teacher": summary["teacher"]["perplexity"],
                "student": summary["student"]["perplexity"],
                "agreement": summary["agreement"],
                "blocks": summary["eval_blocks"],
                "by_position": summary.get("by_position", []),
            }
        except (OSError, ValueError, KeyError, TypeError) as err:
            raise typer.BadParameter(f"{name} is not an eval-lm score file ({err!r})") from err
    return label, scores


def by_position(students: dict[str, Scores]) -> dict[str, list[dict[str, float]]]:
    """Per student, the windows of positions of its longest block scored in more than one window."""
    windows = {}
    for label, scores in students.items():
        split = [size for size, s in scores.items() if len(s["by_position"]) > 1]
        if split:
            windows[label] = scores[max(split)]["by_position"]
    return windows


def position_table(windows: dict[str, list[dict[str, float]]]) -> str:
    """Student ÷ teacher per window of positions, one row per student."""
    spans = sorted({(w["from"], w["to"]) for rows in windows.values() for w in rows})
    lines = [
        "| student ÷ teacher, by position in the block | " + " | ".join(f"{a}-{b}" for a, b in spans) + " |",
        "|---|" + "---|" * len(spans),
    ]
    for label, rows in windows.items():
        ratio = {(w["from"], w["to"]): w["ratio"] for w in rows}
        cells = [f"{ratio[span]:.3f}" if span in ratio else "-" for span in spans]
        lines.append(f"| {label} | {' | '.join(cells)} |")
    return "\n".join(lines) + "\n"


def table(students: dict[str, Scores], sizes: list[int]) -> str:
    head = " | ".join(f"{size}-token blocks: student (teacher) ÷" for size in sizes)
    lines = [f"| student | {head} |", "|---|" + "---|" * len(sizes)]
    for label, scores in students.items():
        cells = [
            f"{s['student']:.2f} ({s['teacher']:.2f}) **{s['ratio']:.3f}**"
            if (s := scores.get(size))
            else "-"
            for size in sizes
        ]
        lines.append(f"| {label} | {' | '.join(cells)} |")
    return "\n".join(lines) + "\n"


def plot(students: dict[str, Scores], sizes: list[int], out: Path) -> None:
    windows = by_position(students)
    with saved_figure(out, (14 if windows else 8, 4), columns=2 if windows else 1) as axes:
        draw_students(axes, students, sizes, windows)


def draw_students(
    axes: list[Any], students: dict[str, Scores], sizes: list[int], windows: dict[str, list[dict[str, float]]]
) -> None:
    """Perplexity ratios by block length on the first axes; by position in the block on the second."""
    ax = axes[0]
    width = 0.8 / len(students)
    for i, (label, scores) in enumerate(students.items()):
        xs = [j + i * width for j, size in enumerate(sizes) if size in scores]
        ys = [scores[size]["ratio"] for size in sizes if size in scores]
        bars = ax.bar(xs, ys, width, label=label)
        ax.bar_label(bars, fmt="%.2f", fontsize=7)
    ax.axhline(1.25, color="black", linestyle="--", linewidth=1, label="goal 1.25")
    ax.set_xticks([j + 0.4 - width / 2 for j in range(len(sizes))], [f"{size} tokens" for size in sizes])
    ax.set_ylabel("student perplexity ÷ teacher's")
    ax.set_title("WikiText-2 valid, by the length of context scored")
    ax.legend(fontsize=7, loc="upper left")
    ax.set_ylim(0, max(s["ratio"] for scores in students.values() for s in scores.values()) * 1.35)
    if windows:
        ax = axes[1]
        for label, rows in windows.items():
            middles = [(w["from"] * w["to"]) ** 0.5 for w in rows]  # geometric: the windows double
            ax.plot(middles, [w["ratio"] for w in rows], marker="o", label=label)
        ax.axhline(1.25, color="black", linestyle="--", linewidth=1, label="goal 1.25")
        ax.axhline(1.0, color="grey", linestyle=":", linewidth=1)
        ax.set_xscale("log", base=2)
        ax.set_xlabel("position in the block (window middle)")
        ax.set_ylabel("student perplexity ÷ teacher's")
        ax.set_title("Where in the context the student falls behind")
        ax.legend(fontsize=7, loc="upper left")


@app.command()
def main(
    specs: list[str] = typer.Argument(..., help="LABEL=FILE[,FILE...] per student."),
    out: Path = typer.Option(..., "--out", help="Writes OUT.md and OUT.png."),
) -> None:
    students = dict(read_scores(spec) for spec in specs)
    sizes = sorted({size for scores in students.values() for size in scores})
    windows = by_position(students)
    report = table(students, sizes) + (f"\n{position_table(windows)}" if windows else "")
    out.parent.mkdir(parents=True, exist_ok=True)
    out.with_suffix(".md").write_text(report)
    plot(students, sizes, out.with_suffix(".png"))
    line_console().print(report, soft_wrap=True)


if __name__ == "__main__":
    app()
