"""Captured traffic: the inputs a served pair's teacher answered, kept as training data for the next student.

The contract between the service (the writer: service.capture) and training (the reader: training.traffic).
A student serves; where its teacher answers anyway (the cascade's unsure inputs, the shadow checks of live
agreement, a pair whose teacher answers directly) the service can keep the input with both models' best
answers, one JSON object per line, one file per process and student:

    <capture dir>/<student>/<UTC time>-<pid>.jsonl

    {"task": "text-classification", "source": "cascade", "time": 1796612345.2,
     "input": "a text" | ["text", "text pair"] | ["question", "context"],
     "teacher": {"model": "sst2-teacher", "version": 3, "answer": {"label": "positive", "score": 0.97}},
     "student": {"model": "sst2", "version": 4, "answer": {...}} | null,
     "agreed": false | true | null}

`answer` is the model's best answer as the service returns it, without `model` (a label and its score; a
span's `answer`, `start`, `end`, `score`; a token's `token`, `token_str`, `sequence`, `score`). `student` is
null where the student did not answer (its teacher answered directly); `agreed` then too. The inputs the
cascade sends are those the student is least sure of, the most a next student can learn from; the shadow
checks are a uniform sample of the rest (DISTILSERVE_SHADOW_RATE). Standard library only.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

Source = Literal["cascade", "shadow", "teacher"]
SOURCES: tuple[Source, ...] = ("cascade", "shadow", "teacher")
SUFFIX = ".jsonl"


@dataclass(frozen=True)
class Answered:
    """One model's best answer to a captured input."""

    model: str
    version: int
    answer: dict[str, Any]


@dataclass(frozen=True)
class Captured:
    """One captured input and what the pair answered."""

    task: str
    source: Source
    input: str | tuple[str, str]
    teacher: Answered
    student: Answered | None
    time: float

    @property
    def agreed(self) -> bool | None:
        """Whether both gave the same best answer, scores aside; None where the student did not answer."""
        if self.student is None:
            return None
        return _without_scores(self.student.answer) == _without_scores(self.teacher.answer)

    def line(self) -> str:
        """The record as one line of its file (newline included)."""
        row = {
            "task": self.task,
            "source": self.source,
            "time": round(self.time, 3),
            "input": self.input if isinstance(self.input, str) else list(self.input),
            "teacher": _answered_row(self.teacher),
            "student": None if self.student is None else _answered_row(self.student),
            "agreed": self.agreed,
        }
        return json.dumps(row, ensure_ascii=False, separators=(",", ":")) + "\n"


def _without_scores(answer: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in answer.items() if k not in ("score", "raw_score")}


def _answered_row(a: Answered) -> dict[str, Any]:
    return {"model": a.model, "version": a.version, "answer": a.answer}


def files(path: Path) -> list[Path]:
    """A capture file, or every capture file under a directory (a student's, or the whole capture dir), in
    name order: oldest first within each process."""
    if path.is_file():
        return [path]
    if not path.is_dir():
        raise ValueError(f"{path}: no such capture file or directory")
    found = sorted(p for p in path.rglob(f"*{SUFFIX}") if p.is_file())
    if not found:
        raise ValueError(f"{path}: no captured traffic (*{SUFFIX}) under it")
    return found


def read(path: Path) -> Iterator[Captured]:
    """Every record under `path` (`files`). A line cut short by a process that stopped mid-write (the last
    of its file) is skipped; any other bad line is an error naming its file and line."""
    for file in files(path):
        with file.open(encoding="utf-8") as handle:
            lines = handle.readlines()
        for lineno, line in enumerate(lines, start=1):
            if not line.strip():
                continue
            if not line.endswith("\n") and lineno == len(lines):
                break  # the process stopped while writing it
            try:
                yield parse(json.loads(line))
            except (json.JSONDecodeError, KeyError, TypeError, ValueError) as err:
                raise ValueError(f"{file}:{lineno}: not a captured record: {err}") from None


def parse(row: Any) -> Captured:
    """One record from its JSON object; ValueError (or KeyError, TypeError) where it is not one."""
    if not isinstance(row, dict):
        raise ValueError(f"expected a JSON object, got {type(row).__name__}")
    source = row["source"]
    if source not in SOURCES:
        raise ValueError(f"source {source!r} is not one of {', '.join(SOURCES)}")
    raw = row["input"]
    if isinstance(raw, list) and len(raw) == 2 and all(isinstance(t, str) for t in raw):
        given: str | tuple[str, str] = (raw[0], raw[1])
    elif isinstance(raw, str):
        given = raw
    else:
        raise ValueError("input must be a text or a list of two texts")
    student = row.get("student")
    return Captured(
        task=str(row["task"]),
        source=source,
        input=given,
        teacher=_answered(row["teacher"]),
        student=None if student is None else _answered(student),
        time=float(row["time"]),
    )


def _answered(row: Any) -> Answered:
    if not isinstance(row, dict) or not isinstance(row["answer"], dict):
        raise ValueError("a model's answer must be an object with an 'answer' object")
    return Answered(model=str(row["model"]), version=int(row["version"]), answer=dict(row["answer"]))
