"""`python -m training split`: real files become train/eval files the loaders read, with nothing shared."""

from __future__ import annotations

import json
from pathlib import Path

from typer.testing import CliRunner

from training.cli import app
from training.data.loaders import load_classification, load_squad, load_text
from training.data.split import split_file


def _sst2(path: Path, n: int = 200) -> Path:
    rows = [f"sentence {i} is {'good' if i % 2 else 'bad'}\t{i % 2}" for i in range(n)]
    path.write_text("sentence\tlabel\n" + "\n".join(rows) + "\n", encoding="utf-8")
    return path


def test_classification_rows_split_without_overlap_and_keep_label_names(tmp_path: Path) -> None:
    files = split_file("text-classification", _sst2(tmp_path / "sst2.tsv"), tmp_path / "out", 0.2, seed=1)
    train, evals = load_classification(files.train), load_classification(files.eval)
    assert (files.n_train, files.n_eval) == (len(train.examples), len(evals.examples))
    assert files.n_train + files.n_eval == 200 and 30 <= files.n_eval <= 50
    assert train.label_names == evals.label_names == ["negative", "positive"]
    assert not {e.text for e in train.examples} & {e.text for e in evals.examples}
    # Labels survive the round trip: the sentence says which one it had.
    for example in train.examples + evals.examples:
        assert ("good" in example.text) == (train.label_names[example.label] == "positive")


def _article(index: int, questions: int) -> dict[str, object]:
    context = f"Article {index} was written in {1900 + index}."
    answer = {"text": str(1900 + index), "answer_start": context.index(str(1900 + index))}
    qas = [{"id": f"{index}-{q}", "question": f"When {q}?", "answers": [answer]} for q in range(questions)]
    return {"title": f"Article {index}", "paragraphs": [{"context": context, "qas": qas}]}


def test_squad_splits_by_article_and_keeps_every_question(tmp_path: Path) -> None:
    articles = [_article(a, questions=3) for a in range(10)]
    source = tmp_path / "squad.json"
    source.write_text(json.dumps({"version": "1.1", "data": articles}), encoding="utf-8")
    files = split_file("question-answering", source, tmp_path / "out", 0.2, seed=0)
    train, evals = load_squad(files.train), load_squad(files.eval)
    assert len(train) + len(evals) == 30 and evals
    assert not {e.title for e in train} & {e.title for e in evals}
    assert sorted(e.id for e in train + evals) == sorted(f"{a}-{q}" for a in range(10) for q in range(3))


def test_wikitext_splits_by_article_and_same_seed_gives_same_files(tmp_path: Path) -> None:
    lines = []
    for a in range(20):
        lines += [f" = Title {a} = ", "", " = = Part = = ", f" line one of {a} ", f" line two of {a} ", ""]
    source = tmp_path / "wiki.txt"
    source.write_text("\n".join(lines), encoding="utf-8")
    first = split_file("text-generation", source, tmp_path / "a", 0.25, seed=3)
    second = split_file("fill-mask", source, tmp_path / "b", 0.25, seed=3)
    assert first.eval.read_bytes() == second.eval.read_bytes()
    train, evals = load_text(first.train), load_text(first.eval)
    assert len(train) + len(evals) == 40 and evals
    articles_of = lambda part: {line.rsplit(" ", 1)[1] for line in part}  # noqa: E731
    assert not articles_of(train) & articles_of(evals)  # both lines of an article stay together


def test_cli_split_writes_both_files_and_refuses_an_unknown_task(tmp_path: Path) -> None:
    source = _sst2(tmp_path / "sst2.tsv", n=50)
    result = CliRunner().invoke(
        app, ["split", str(source), "--out", str(tmp_path / "out"), "--eval-fraction", "0.2"]
    )
    assert result.exit_code == 0, result.output
    assert (tmp_path / "out" / "train.jsonl").exists() and (tmp_path / "out" / "eval.jsonl").exists()
    bad = CliRunner().invoke(app, ["split", str(source), "--out", str(tmp_path / "x"), "--task", "nope"])
    assert bad.exit_code != 0 and "unknown task" in bad.output


def test_a_split_that_leaves_eval_empty_is_refused_before_writing(tmp_path: Path) -> None:
    source = _sst2(tmp_path / "sst2.tsv", n=50)
    result = CliRunner().invoke(
        app, ["split", str(source), "--out", str(tmp_path / "out"), "--eval-fraction", "0"]
    )
    assert result.exit_code != 0
    assert "50 rows leave 0 for eval and 50 for training; raise --eval-fraction" in result.output
    assert not (tmp_path / "out").exists()
    squad = tmp_path / "train.json"
    squad.write_text('{"data": []}')
    as_text = CliRunner().invoke(
        app, ["split", str(squad), "--out", str(tmp_path / "t"), "--task", "fill-mask"]
    )
    assert as_text.exit_code != 0 and "SQuAD-style QA, not plain text" in as_text.output
