"""Data for sentence-embedding distillation: unlabelled sentences to train on, and sets to score on.

- Sentences: plain text (one a line), or the classification files' formats (`.jsonl` rows with `text` or
  `sentence`, a `.tsv`/`.csv` with a header naming one of those: SST-2's train file as it is); labels are
  ignored, exact repeats are kept once.
- STS pairs: a `.tsv`/`.csv` with a header naming `sentence1`, `sentence2` and `score` (or `label`), as GLUE's
  STS-B files are (its other columns are ignored), or `.jsonl` rows with those keys.
- Retrieval: SQuAD v1.1 JSON; each question's candidates are the paragraphs of its own article, the gold
  one is its paragraph.
"""

from __future__ import annotations

import csv
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from training.data.loaders import load_squad, load_text
from training.data.types import TextData

SENTENCE_KEYS = ("sentence", "text")
SCORE_KEYS = ("score", "label")


@dataclass(frozen=True)
class StsData:
    """Sentence pairs with a gold similarity score (STS-B: 0 to 5)."""

    first: list[str]
    second: list[str]
    scores: list[float]
    source: str


@dataclass(frozen=True)
class RetrievalData:
    """Queries, candidates, each query's gold candidate, and which candidates each query may choose from
    (the group: a SQuAD article)."""

    queries: list[str]
    candidates: list[str]
    gold: list[int]
    query_groups: list[int]
    candidate_groups: list[int]
    source: str


def _rows(file: Path) -> list[tuple[int, dict[str, Any]]]:
    """(line number, row) for a .jsonl file or a .tsv/.csv file with a header row; keys lower-cased."""
    suffix = file.suffix.lower()
    with file.open(encoding="utf-8-sig", newline="") as handle:
        if suffix == ".jsonl":
            rows = []
            for lineno, line in enumerate(handle, start=1):
                if line.strip():
                    obj = json.loads(line)
                    if not isinstance(obj, dict):
                        raise ValueError(f"{file}:{lineno}: expected a JSON object")
                    rows.append((lineno, {str(k).lower(): v for k, v in obj.items()}))
            return rows
        # GLUE TSVs are unquoted and hold stray quote characters: read them without quoting.
        if suffix == ".tsv":
            reader = csv.reader(handle, delimiter="\t", quoting=csv.QUOTE_NONE)
        else:
            reader = csv.reader(handle)
        header = [name.strip().lower() for name in next(reader, [])]
        rows = []
        for record in reader:
            if not any(field.strip() for field in record):
                continue
            if len(record) != len(header):
                raise ValueError(
                    f"{file}:{reader.line_num}: expected {len(header)} fields, got {len(record)}"
                )
            rows.append((reader.line_num, dict(zip(header, record, strict=True))))
        return rows


def _first_key(file: Path, row: dict[str, Any], keys: tuple[str, ...]) -> str:
    found = next((key for key in keys if key in row), None)
    if found is None:
        raise ValueError(f"{file}: rows need a {' or '.join(repr(k) for k in keys)} field, got {sorted(row)}")
    return found


def load_sentences(path: str | Path) -> TextData:
    """Unlabelled sentences, each once, in file order."""
    file = Path(path)
    if file.suffix.lower() in (".jsonl", ".tsv", ".csv"):
        rows = _rows(file)
        key = _first_key(file, rows[0][1], SENTENCE_KEYS) if rows else "text"
        texts = [str(row[key]).strip() for _, row in rows]
    else:
        texts = load_text(file, skip_headings=True)
    sentences = list(dict.fromkeys(t for t in texts if t))
    if not sentences:
        raise ValueError(f"{file}: no sentences found")
    return TextData(lines=sentences, source=str(path))


def load_sts(path: str | Path) -> StsData:
    """Sentence pairs and their gold scores."""
    file = Path(path)
    if file.suffix.lower() not in (".jsonl", ".tsv", ".csv"):
        raise ValueError(f"{file}: an STS file is .tsv, .csv or .jsonl with sentence1, sentence2, score")
    rows = _rows(file)
    if len(rows) < 2:
        raise ValueError(f"{file}: an STS set needs two pairs at least, found {len(rows)}")
    for key in ("sentence1", "sentence2"):
        _first_key(file, rows[0][1], (key,))
    score = _first_key(file, rows[0][1], SCORE_KEYS)
    scores = []
    for lineno, row in rows:
        try:
            scores.append(float(row[score]))
        except (TypeError, ValueError):
            raise ValueError(f"{file}:{lineno}: score {row[score]!r} is not a number") from None
    return StsData(
        first=[str(row["sentence1"]).strip() for _, row in rows],
        second=[str(row["sentence2"]).strip() for _, row in rows],
        scores=scores,
        source=str(path),
    )


def sts_retrieval(data: StsData, gold_share: float = 0.8) -> RetrievalData:
    """Retrieval over an STS set: each first sentence queries all distinct second sentences. Its own second
    sentence is gold when the pair scores at least `gold_share` of the top score (STS-B: 4 of 5, "mostly
    equivalent"); other queries count for agreement only."""
    candidates = list(dict.fromkeys(data.second))
    index = {text: i for i, text in enumerate(candidates)}
    threshold = gold_share * max(data.scores)
    gold = [
        index[second] if score >= threshold else -1
        for second, score in zip(data.second, data.scores, strict=True)
    ]
    return RetrievalData(
        queries=list(data.first),
        candidates=candidates,
        gold=gold,
        query_groups=[0] * len(data.first),
        candidate_groups=[0] * len(candidates),
        source=data.source,
    )


def squad_retrieval(path: str | Path) -> RetrievalData:
    """SQuAD questions against the paragraphs of their own article; the gold one holds the question."""
    examples = load_squad(path)
    articles: dict[str, int] = {}
    paragraphs: dict[tuple[str, str], int] = {}
    candidate_groups: list[int] = []
    for example in examples:
        group = articles.setdefault(example.title, len(articles))
        if (example.title, example.context) not in paragraphs:
            paragraphs[example.title, example.context] = len(paragraphs)
            candidate_groups.append(group)
    return RetrievalData(
        queries=[e.question for e in examples],
        candidates=[context for _, context in paragraphs],
        gold=[paragraphs[e.title, e.context] for e in examples],
        query_groups=[articles[e.title] for e in examples],
        candidate_groups=candidate_groups,
        source=str(path),
    )
