"""Plain records every task's loader returns, whatever the file format they came from."""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(frozen=True)
class ClassificationExample:
    text: str
    label: int
    pair: str | None = None  # a second text read with the first (a query's document; GLUE's sentence2)


@dataclass(frozen=True)
class ClassificationData:
    """Examples plus the label names their ids index, and where they came from."""

    examples: list[ClassificationExample]
    label_names: list[str]
    source: str


@dataclass(frozen=True)
class Answer:
    text: str
    start: int  # character offset into the context


@dataclass(frozen=True)
class QAExample:
    id: str
    title: str
    question: str
    context: str
    answers: list[Answer] = field(default_factory=list)


@dataclass(frozen=True)
class TextData:
    """Plain-text lines (language modelling), and where they came from."""

    lines: list[str]
    source: str
