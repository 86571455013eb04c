"""Carve a train and an eval file out of one real data file, so an eval score never sees training data.

Classification rows split by row, SQuAD by article (questions on one paragraph share its wording, so a
row split would leak), text by WikiText article (headings mark them; a file without headings splits by
line). The parts are written in formats the loaders read: JSON lines with label names, SQuAD v1.1 JSON,
plain text.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from training.data.loaders import is_heading, load_classification, load_squad, split_examples
from training.data.writers import write_json, write_jsonl, write_lines


@dataclass(frozen=True)
class SplitFiles:
    train: Path
    eval: Path
    n_train: int  # rows, questions or lines
    n_eval: int


def split_file(task: str, source: Path, out_dir: Path, eval_fraction: float, seed: int) -> SplitFiles:
    """Write out_dir/train.<ext> and out_dir/eval.<ext> for `task` from `source`."""
    if task == "text-classification":
        return _split_classification(source, out_dir, eval_fraction, seed)
    if task == "question-answering":
        return _split_squad(source, out_dir, eval_fraction, seed)
    if task in ("fill-mask", "text-generation"):
        return _split_text(source, out_dir, eval_fraction, seed)
    raise ValueError(f"unknown task {task!r}")


def _split_classification(source: Path, out_dir: Path, fraction: float, seed: int) -> SplitFiles:
    data = load_classification(source)
    train, evals = split_examples(data.examples, fraction, seed)
    _require_both(source, len(data.examples), train, evals, "rows")
    paths = out_dir / "train.jsonl", out_dir / "eval.jsonl"
    for path, part in zip(paths, (train, evals), strict=True):
        write_jsonl(path, [{"text": e.text, "label": data.label_names[e.label]} for e in part])
    return SplitFiles(*paths, len(train), len(evals))


def _split_squad(source: Path, out_dir: Path, fraction: float, seed: int) -> SplitFiles:
    examples = load_squad(source)  # validates every answer offset before anything is written
    train, evals = split_examples(examples, fraction, seed, group=lambda e: e.title)
    _require_both(source, len(examples), train, evals, "questions (split by article)")
    eval_titles = {e.title for e in evals}
    doc = json.loads(source.read_text(encoding="utf-8"))
    paths = out_dir / "train.json", out_dir / "eval.json"
    for path, keep_eval in zip(paths, (False, True), strict=True):
        articles = [a for a in doc["data"] if (a["title"] in eval_titles) == keep_eval]
        write_json(path, {"version": doc.get("version", "1.1"), "data": articles})
    return SplitFiles(*paths, len(train), len(evals))


def _split_text(source: Path, out_dir: Path, fraction: float, seed: int) -> SplitFiles:
    if source.suffix.lower() == ".json":  # read as text, a SQuAD file is one huge "paragraph"
        raise ValueError(
            f"{source}: a .json file is SQuAD-style QA, not plain text: --task question-answering"
        )
    lines = [line.rstrip("\n") for line in source.read_text(encoding="utf-8").splitlines()]
    articles = _articles(lines)
    train, evals = split_examples(articles, fraction, seed)
    _require_both(source, len(articles), train, evals, "articles (or lines)")
    paths = out_dir / "train.txt", out_dir / "eval.txt"
    for path, part in zip(paths, (train, evals), strict=True):
        write_lines(path, [line for article in part for line in article])
    count = sum(len(a) for a in train), sum(len(a) for a in evals)
    return SplitFiles(*paths, *count)


def _require_both(
    source: Path, total: int, train: Sequence[object], evals: Sequence[object], unit: str
) -> None:
    """Refuse, before anything is written, a split that leaves one side empty: each is needed."""
    if not train or not evals:
        raise ValueError(
            f"{source}: {total} {unit} leave {len(evals)} for eval and {len(train)} for training; "
            "raise --eval-fraction or use a larger file"
        )


def _articles(lines: Sequence[str]) -> list[list[str]]:
    """WikiText articles start at a top-level heading (`= Title =`); without headings, one line each."""
    if not any(_is_title(line) for line in lines):
        return [[line] for line in lines if line.strip()]
    articles: list[list[str]] = []
    for line in lines:
        if _is_title(line) or not articles:
            articles.append([])
        if line.strip():
            articles[-1].append(line)
    return articles


def _is_title(line: str) -> bool:
    stripped = line.strip()
    return is_heading(stripped) and not stripped.startswith("= =")
