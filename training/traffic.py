"""Traffic a served pair's teacher answered (DISTILSERVE_CAPTURE_DIR) as training data for the next student.

The service keeps, for a student served with its teacher, every input the teacher answered and both answers
(common.capture). This turns those records into the task's own training file, the teacher's best answer as
the label, after the original training data where one is given, so that `distill --train OUT` (from the
served student, `--student-init`) learns the traffic it serves as well as what it was distilled on:

- text-classification: JSON lines `{text, [text_pair], label}` (the loader's format);
- question-answering: a SQuAD v1.1 file, the traffic as one article (`captured traffic`), answers the
  teacher's spans (checked against their context);
- fill-mask: plain text, the teacher's filled sentence a line (the MLM objective masks it again).

An input captured more than once keeps its latest record. Inputs that contain an eval text, or lie inside
one, are left out (`--eval`): whatever a run then scores stays unseen. Standard library only: no model runs.
"""

from __future__ import annotations

import json
import random
import re
from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

from common.capture import Captured, Source, read
from training.data.containment import WordIndex
from training.data.loaders import load_classification, load_squad, load_text, squad_document
from training.data.types import Answer, QAExample

T = TypeVar("T")
CAPTURED_TITLE = "captured traffic"
TASKS = ("text-classification", "question-answering", "fill-mask")


@dataclass
class TrafficCounts:
    """What a conversion read and kept, for the run's log and report."""

    read: Counter[str] = field(default_factory=Counter)  # records of the task, by source
    other_tasks: int = 0
    repeated: int = 0  # an input captured again (its latest record kept)
    inside_eval: int = 0  # an input containing an eval text, or inside one
    unusable: int = 0  # no label the file can hold (an empty span, one not in its context)
    kept: int = 0
    disagreed: int = 0  # of those kept, where the student's answer was not the teacher's
    original: int = 0
    calibration: int = 0  # captured inputs written to the calibration file instead
    teachers: Counter[str] = field(default_factory=Counter)  # "name:version" of the teachers that answered

    def as_dict(self) -> dict[str, Any]:
        return {
            "read": dict(self.read),
            "other_tasks": self.other_tasks,
            "repeated": self.repeated,
            "inside_eval": self.inside_eval,
            "unusable": self.unusable,
            "kept": self.kept,
            "disagreed": self.disagreed,
            "original": self.original,
            "calibration": self.calibration,
            "teachers": dict(self.teachers),
        }


def traffic_dataset(
    task: str,
    captures: Sequence[Path],
    out: Path,
    *,
    train: Path | None = None,
    eval_texts: Sequence[str] = (),
    sources: Sequence[Source] = ("cascade", "shadow", "teacher"),
    disagreed_only: bool = False,
    original_rows: int | None = None,
    seed: int = 0,
    calibration: Path | None = None,
    calibration_share: float = 0.2,
) -> TrafficCounts:
    """Write `out`: `train`'s examples (if given; `original_rows` of them drawn with `seed`, a replay of
    the old data beside the new, else all), then the captured inputs of `task` as the teacher answered them.
    `eval_texts` are texts no kept input may contain or lie inside. With `calibration`, a seeded
    `calibration_share` of the captured inputs goes there instead, alone, in the same format: traffic the
    next student never trained on, for the export to gate and calibrate its cascade on (`--eval-data`)."""
    if task not in TASKS:
        raise ValueError(f"captured traffic trains {', '.join(TASKS)}, not {task}")
    counts = TrafficCounts()
    records = _latest(task, [r for path in captures for r in read(path)], sources, counts)
    records = _outside(records, eval_texts, counts)
    if calibration is not None:
        if not 0.0 < calibration_share < 1.0:
            raise ValueError(f"the calibration share must lie in (0, 1), got {calibration_share}")
        chosen = set(random.Random(seed).sample(range(len(records)), round(calibration_share * len(records))))
        side = TrafficCounts()
        _write(
            task, [r for i, r in enumerate(records) if i in chosen], None, calibration, side, _Sample(None, 0)
        )
        counts.calibration = side.kept
        records = [r for i, r in enumerate(records) if i not in chosen]
    if disagreed_only:
        records = [r for r in records if r.agreed is False]
    _write(task, records, train, out, counts, _Sample(original_rows, seed))
    counts.disagreed = sum(r.agreed is False for r in records if _usable(task, r))
    return counts


def _write(
    task: str, records: list[Captured], train: Path | None, out: Path, counts: TrafficCounts, keep: _Sample
) -> None:
    out.parent.mkdir(parents=True, exist_ok=True)
    if task == "text-classification":
        _write_classification(records, train, out, counts, keep)
    elif task == "question-answering":
        _write_squad(records, train, out, counts, keep)
    else:
        _write_text(records, train, out, counts, keep)


def _latest(
    task: str, records: Iterable[Captured], sources: Sequence[Source], counts: TrafficCounts
) -> list[Captured]:
    """The task's records from the chosen sources, one per input (its latest), in first-seen order."""
    latest: dict[str | tuple[str, str], Captured] = {}
    for record in records:
        if record.task != task:
            counts.other_tasks += 1
            continue
        if record.source not in sources:
            continue
        counts.read[record.source] += 1
        counts.teachers[f"{record.teacher.model}:{record.teacher.version}"] += 1
        seen = latest.get(record.input)
        if seen is not None:
            counts.repeated += 1
            if seen.time > record.time:
                continue
        latest[record.input] = record
    return list(latest.values())


def words_of(text: str) -> str:
    """The text's words, lowercased, punctuation aside, space-padded: `a in b` tests whole-word containment.
    (Traffic is written as people write, "film," and all; SST-2's rows are tokenized, which
    training.data.containment's whitespace words suit.)"""
    return " " + " ".join(re.findall(r"\w+", text.lower())) + " "


def _outside(records: list[Captured], eval_texts: Sequence[str], counts: TrafficCounts) -> list[Captured]:
    """The records none of whose texts contains an eval text or lies inside one (as whole words)."""
    evals = [t for t in {words_of(t) for t in eval_texts} if t.strip()]
    if not evals or not records:
        return records
    texts = [[words_of(t) for t in ([r.input] if isinstance(r.input, str) else r.input)] for r in records]
    owner = [i for i, padded in enumerate(texts) for _ in padded]
    captured = _indexed([t for padded in texts for t in padded])
    eval_index = _indexed(evals)
    out = {owner[j] for e in evals for j in captured.containing(e)}  # an input containing an eval text
    out |= {i for i, padded in enumerate(texts) if any(eval_index.containing(t) for t in padded)}
    counts.inside_eval += len(out)
    return [r for i, r in enumerate(records) if i not in out]


def _indexed(padded: Sequence[str]) -> WordIndex:
    index = WordIndex(Counter(w for t in padded for w in t.split()))
    for t in padded:
        index.add(t)
    return index


def _usable(task: str, record: Captured) -> bool:
    answer = record.teacher.answer
    if task == "text-classification":
        return isinstance(answer.get("label"), str)
    if task == "question-answering":
        return _span(record) is not None
    return isinstance(answer.get("sequence"), str) and bool(answer["sequence"].strip())


@dataclass(frozen=True)
class _Sample:
    """How many of the original examples to keep (None: all), drawn with a seed, in their order."""

    rows: int | None
    seed: int

    def __call__(self, items: list[T]) -> list[T]:
        if self.rows is None or self.rows >= len(items):
            return items
        chosen = sorted(random.Random(self.seed).sample(range(len(items)), self.rows))
        return [items[i] for i in chosen]


def _write_classification(
    records: list[Captured], train: Path | None, out: Path, counts: TrafficCounts, keep: _Sample
) -> None:
    rows: list[dict[str, Any]] = []
    names: list[str] | None = None
    if train is not None:
        data = load_classification(train)
        names = data.label_names
        for e in keep(data.examples):
            row: dict[str, Any] = {"text": e.text, "label": names[e.label]}
            if e.pair is not None:
                row["text_pair"] = e.pair
            rows.append(row)
        counts.original = len(rows)
    paired = {isinstance(r.input, tuple) for r in records}
    if len(paired) > 1 or (rows and paired and paired != {"text_pair" in rows[0]}):
        raise ValueError("captured inputs mix single texts and pairs (or differ from the training file's)")
    for record in records:
        if not _usable("text-classification", record):
            counts.unusable += 1
            continue
        label = record.teacher.answer["label"]
        if names is not None and label not in names:
            raise ValueError(
                f"the teacher {record.teacher.model} answered {label!r}, not one of the training file's "
                f"labels {names}: a teacher of another task?"
            )
        given = record.input
        rows.append(
            {"text": given, "label": label}
            if isinstance(given, str)
            else {"text": given[0], "text_pair": given[1], "label": label}
        )
        counts.kept += 1
    if not rows:
        raise ValueError("nothing to write: no captured input of the task, and no training file")
    with out.open("w", encoding="utf-8") as handle:
        for row in rows:
            handle.write(json.dumps(row, ensure_ascii=False) + "\n")


def _span(record: Captured) -> Answer | None:
    """The teacher's span as a SQuAD answer, where it is one and lies in its context as captured."""
    answer, given = record.teacher.answer, record.input
    if not isinstance(given, tuple):
        return None
    text, start, end = answer.get("answer"), answer.get("start"), answer.get("end")
    if not (isinstance(text, str) and text.strip() and isinstance(start, int) and isinstance(end, int)):
        return None
    return Answer(text=text, start=start) if given[1][start:end] == text else None


def _write_squad(
    records: list[Captured], train: Path | None, out: Path, counts: TrafficCounts, keep: _Sample
) -> None:
    examples: list[QAExample] = [] if train is None else keep(load_squad(train))
    counts.original = len(examples)
    for n, record in enumerate(records):
        span, given = _span(record), record.input
        if span is None or isinstance(given, str):
            counts.unusable += 1
            continue
        question, context = given
        examples.append(QAExample(f"captured-{n}", CAPTURED_TITLE, question, context, [span]))
        counts.kept += 1
    if not examples:
        raise ValueError("nothing to write: no captured input of the task, and no training file")
    out.write_text(json.dumps(squad_document(examples), ensure_ascii=False) + "\n", encoding="utf-8")


def _write_text(
    records: list[Captured], train: Path | None, out: Path, counts: TrafficCounts, keep: _Sample
) -> None:
    lines = [] if train is None else keep(load_text(train))
    counts.original = len(lines)
    for record in records:
        if not _usable("fill-mask", record):
            counts.unusable += 1
            continue
        lines.append(" ".join(str(record.teacher.answer["sequence"]).split()))
        counts.kept += 1
    if not lines:
        raise ValueError("nothing to write: no captured input of the task, and no training file")
    out.write_text("".join(line + "\n" for line in lines), encoding="utf-8")
