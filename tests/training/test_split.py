"""`python -m training split`: real files become train/eval files the loaders read, with nothing shared."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from training.cli import app
from training.data.containment import count_inside, maximal_containers
from training.data.loaders import load_classification, load_squad, load_text, split_examples
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


def _phrases(path: Path, sentences: int = 40) -> Path:
    """SST-2-like rows: whole sentences, every run of words inside them as a row of its own (so phrases
    overlap and repeat across sentences, "the film" and "is" in all), and the label of its sentence."""
    rows = []
    for s in range(sentences):
        label = s % 2
        words = f"the film {s} is a {'fine' if label else 'dull'} story of place {s % 7}".split()
        for size in range(1, len(words) + 1):
            rows += [(" ".join(words[i : i + size]), label) for i in range(0, len(words) - size + 1, 2)]
    lines = [f"{text}\t{label}" for text, label in rows]
    path.write_text("sentence\tlabel\n" + "\n".join(lines) + "\n", encoding="utf-8")
    return path


def _inside(inner: str, outer: str) -> bool:
    """Word-for-word containment, written out plainly: the property a user relies on."""
    return f" {' '.join(inner.lower().split())} " in f" {' '.join(outer.lower().split())} "


def test_no_eval_phrase_lies_inside_a_training_phrase(tmp_path: Path) -> None:
    source = _phrases(tmp_path / "phrases.tsv")
    files = split_file("text-classification", source, tmp_path / "out", 0.2, seed=0)
    train, evals = load_classification(files.train).examples, load_classification(files.eval).examples
    total = len(load_classification(source).examples)
    assert files.n_train + files.n_eval == total and 0.1 * total <= files.n_eval <= 0.3 * total
    leaks = [e.text for e in evals if any(_inside(e.text, t.text) for t in train)]
    assert leaks == [] and files.eval_inside_train == 0
    assert any(" " not in e.text for e in evals)  # a sentence's own words still go to eval with it
    # The old split by row would have leaked: most eval rows of a row split sit inside training rows.
    by_row_train, by_row_eval = split_examples(load_classification(source).examples, 0.2, 0)
    assert sum(any(_inside(e.text, t.text) for t in by_row_train) for e in by_row_eval) > len(by_row_eval) / 2
    again = split_file("text-classification", source, tmp_path / "again", 0.2, seed=0)
    assert again.eval.read_bytes() == files.eval.read_bytes()


def test_a_given_eval_file_is_held_out_whole_and_training_rows_containing_it_are_left_out(
    tmp_path: Path,
) -> None:
    source = _sst2(tmp_path / "train.tsv", n=50)
    held = tmp_path / "test.tsv"
    held.write_text("sentence\tlabel\nsentence 7 is\t1\nsomething new\t0\n", encoding="utf-8")
    files = split_file("text-classification", source, tmp_path / "out", 0.1, seed=0, eval_source=held)
    train = load_classification(files.train).examples
    assert [e.text for e in load_classification(files.eval).examples] == ["sentence 7 is", "something new"]
    assert files.left_out == 1 and len(train) == 49 and "sentence 7 is good" not in {e.text for e in train}
    assert files.eval_inside_train == 0
    other = tmp_path / "other.tsv"
    other.write_text("sentence\tlabel\nfine\tpositive\n", encoding="utf-8")
    with pytest.raises(ValueError, match="are not the training file's"):
        split_file("text-classification", source, tmp_path / "x", 0.1, seed=0, eval_source=other)


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
    assert "eval rows lying word for word inside a training row: 0" in result.output
    held = tmp_path / "test.tsv"
    held.write_text("sentence\tlabel\nsentence 7 is\t1\nnew\t0\n", encoding="utf-8")
    given = CliRunner().invoke(
        app, ["split", str(source), "--out", str(tmp_path / "given"), "--eval-file", str(held)]
    )
    assert given.exit_code == 0, given.output
    assert "training rows left out because an eval text lies inside them: 1" in given.output
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


def test_containment_is_by_whole_words_and_ignores_case_and_spacing() -> None:
    texts = ["A  good film", "good", "goodness", "a good film", "film noir"]
    containers = maximal_containers(texts)
    assert containers[0] == containers[3]  # equal once case and spacing are set aside
    assert containers[1] == containers[0]  # "good" lies in the sentence only: it goes where the sentence goes
    assert containers[2] != containers[0]  # "good" is not inside "goodness": a word is not a phrase
    assert len({*containers[0], *containers[4]}) == 2  # "film" alone would be shared; these are two sentences
    assert count_inside(["good film", "bad film", "Goodness"], texts) == 2
