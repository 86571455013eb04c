"""Carve a train and an eval file out of one real data file, so an eval score never sees training data.

Classification rows split by sentence: a row goes to eval only with the one maximal text (sentence) it lies
in, and a phrase shared by several sentences trains, so no eval text lies word for word inside a training
text (SST-2's rows are overlapping phrases of the same sentences: a row split put 5,955 of 6,735 eval rows
inside training rows). Or a separate eval file is held out whole, and the training rows that contain one of
its texts are left out. SQuAD splits by article (questions on one paragraph share its wording, so a row
split would leak), text by WikiText article (headings mark them; a file without headings splits by line).
The parts are written in formats the loaders read: JSON lines with label names, SQuAD v1.1 JSON, plain text.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass, replace
from pathlib import Path

from training.data.containment import containing_any, count_inside, maximal_containers
from training.data.loaders import is_heading, load_classification, load_squad, split_examples
from training.data.types import ClassificationExample
from training.data.writers import write_json, write_jsonl, write_lines


@dataclass(frozen=True)
class SplitFiles:
    train: Path
    eval: Path
    n_train: int  # rows, questions or lines
    n_eval: int
    eval_inside_train: int | None = None  # classification: eval rows lying word for word in a training row
    left_out: int = 0  # training rows left out because an eval text lies inside them (a given eval file)


def split_file(
    task: str, source: Path, out_dir: Path, eval_fraction: float, seed: int, eval_source: Path | None = None
) -> SplitFiles:
    """Write out_dir/train.<ext> and out_dir/eval.<ext> for `task` from `source` (and `eval_source`)."""
    if eval_source is not None:
        if task != "text-classification":
            raise ValueError(f"a separate eval file is held out for text-classification only, not {task}")
        return _hold_out_classification(source, eval_source, out_dir)
    if task == "text-classification":
        return _split_classification(source, out_dir, eval_fraction, seed)
    if task == "question-answering":
        return _split_squad(source, out_dir, eval_fraction, seed)
    if task in ("fill-mask", "text-generation"):
        return _split_text(source, out_dir, eval_fraction, seed)
    raise ValueError(f"unknown task {task!r}")


def _split_classification(source: Path, out_dir: Path, fraction: float, seed: int) -> SplitFiles:
    data = load_classification(source)
    train, evals = split_by_sentence(data.examples, fraction, seed)
    _require_both(source, len(data.examples), train, evals, "rows")
    return _write_classification(out_dir, data.label_names, train, evals)


def split_by_sentence(
    examples: Sequence[ClassificationExample], fraction: float, seed: int
) -> tuple[list[ClassificationExample], list[ClassificationExample]]:
    """About `fraction` of the rows to eval as whole sentences, each with the phrases that lie only in it.

    A phrase inside two sentences trains: were it in eval, the other sentence (or a phrase of it) could
    be a training row containing it. Both parts keep the input order.
    """
    containers = maximal_containers([e.text for e in examples])
    own = [row for row, inside in enumerate(containers) if len(inside) == 1]
    share = min(fraction * len(examples) / max(len(own), 1), 0.9)  # the shared rows all train
    _, eval_rows = split_examples(own, share, seed, group=lambda row: containers[row][0])
    held = set(eval_rows)
    train = [e for row, e in enumerate(examples) if row not in held]
    return train, [examples[row] for row in sorted(held)]


def _hold_out_classification(source: Path, eval_source: Path, out_dir: Path) -> SplitFiles:
    """All of `eval_source` for eval; `source` for training, less the rows an eval text lies inside."""
    data, held = load_classification(source), load_classification(eval_source)
    if data.label_names != held.label_names:
        raise ValueError(
            f"{eval_source}: labels {held.label_names} are not the training file's {data.label_names}"
        )
    inside = containing_any([e.text for e in data.examples], (e.text for e in held.examples))
    train = [e for row, e in enumerate(data.examples) if row not in inside]
    _require_both(source, len(data.examples), train, held.examples, "rows")
    return replace(
        _write_classification(out_dir, data.label_names, train, held.examples), left_out=len(inside)
    )


def _write_classification(
    out_dir: Path,
    label_names: Sequence[str],
    train: Sequence[ClassificationExample],
    evals: Sequence[ClassificationExample],
) -> SplitFiles:
    """Both parts as JSON lines with label names, and how many eval rows still lie in a training row."""
    paths = out_dir / "train.jsonl", out_dir / "eval.jsonl"
    for path, part in zip(paths, (train, evals), strict=True):
        write_jsonl(path, [{"text": e.text, "label": label_names[e.label]} for e in part])
    leaked = count_inside((e.text for e in evals), [e.text for e in train])
    return SplitFiles(*paths, len(train), len(evals), eval_inside_train=leaked)


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
