"""Demo data generator and format loaders: determinism, format correctness and round trips."""

from __future__ import annotations

import json
import re
from collections import Counter
from pathlib import Path

import pytest

from training.data.demo import DemoFiles, write_demo_data
from training.data.loaders import is_heading, load_classification, load_squad, load_text, split_examples
from training.data.sentences import load_sts
from training.data.types import ClassificationExample

SMALL = {"n_classification": 400, "n_qa": 200, "n_text_lines": 300}


@pytest.fixture(scope="module")
def demo(tmp_path_factory: pytest.TempPathFactory) -> DemoFiles:
    return write_demo_data(tmp_path_factory.mktemp("demo"), seed=0, **SMALL)


def _all_files(files: DemoFiles) -> list[Path]:
    return [
        files.classification_train,
        files.classification_eval,
        files.qa_train,
        files.qa_eval,
        files.text_train,
        files.text_eval,
        files.sts_eval,
    ]


# --------------------------------------------------------------------------- generator


def test_same_seed_gives_identical_files(demo: DemoFiles, tmp_path: Path) -> None:
    again = write_demo_data(tmp_path / "again", seed=0, **SMALL)
    for first, second in zip(_all_files(demo), _all_files(again), strict=True):
        assert first.read_bytes() == second.read_bytes(), first.name


def test_different_seed_gives_different_files(demo: DemoFiles, tmp_path: Path) -> None:
    other = write_demo_data(tmp_path / "other", seed=1, **SMALL)
    for first, second in zip(_all_files(demo), _all_files(other), strict=True):
        assert first.read_bytes() != second.read_bytes(), first.name


def test_classification_is_balanced_and_split_without_overlap(demo: DemoFiles) -> None:
    train = [json.loads(line) for line in demo.classification_train.read_text().splitlines()]
    evals = [json.loads(line) for line in demo.classification_eval.read_text().splitlines()]
    assert len(train) + len(evals) == SMALL["n_classification"]
    assert len(evals) == 40
    for rows in (train, evals):
        counts = Counter(row["label"] for row in rows)
        assert set(counts) == {"positive", "negative"}
        assert abs(counts["positive"] - counts["negative"]) <= 1
    assert not {row["text"] for row in train} & {row["text"] for row in evals}


def test_smoke_sentence_words_are_frequent_and_polarity_words_one_sided(tmp_path: Path) -> None:
    """The words of the downstream smoke-test sentences must be well covered by the training data."""
    files = write_demo_data(tmp_path, seed=0, n_qa=10, n_text_lines=10)
    per_label: dict[str, Counter[str]] = {"positive": Counter(), "negative": Counter()}
    for line in files.classification_train.read_text().splitlines():
        row = json.loads(line)
        per_label[row["label"]].update(re.findall(r"[a-z]+", row["text"].lower()))
    total = per_label["positive"] + per_label["negative"]
    smoke_words = ("i", "loved", "this", "film", "it", "was", "wonderful", "a", "dull", "terrible", "hated")
    for word in (*smoke_words, "every", "minute", "of"):
        assert total[word] >= 100, word
    for word in ("loved", "wonderful"):
        assert per_label["negative"][word] == 0, word
    for word in ("hated", "dull", "terrible"):
        assert per_label["positive"][word] == 0, word


def test_qa_answers_are_exact_substrings_at_answer_start(demo: DemoFiles) -> None:
    n_questions = 0
    for path in (demo.qa_train, demo.qa_eval):
        doc = json.loads(path.read_text())
        assert doc["version"] == "1.1"
        for article in doc["data"]:
            for paragraph in article["paragraphs"]:
                context = paragraph["context"]
                assert paragraph["qas"]
                for qa in paragraph["qas"]:
                    n_questions += 1
                    assert qa["question"].endswith("?")
                    for answer in qa["answers"]:
                        start = answer["answer_start"]
                        assert context[start : start + len(answer["text"])] == answer["text"]
    assert n_questions == SMALL["n_qa"]


def test_qa_train_and_eval_share_no_article(demo: DemoFiles) -> None:
    train = {a["title"] for a in json.loads(demo.qa_train.read_text())["data"]}
    evals = {a["title"] for a in json.loads(demo.qa_eval.read_text())["data"]}
    assert train and evals
    assert not train & evals


def test_text_lines_are_prose(demo: DemoFiles) -> None:
    train = demo.text_train.read_text().splitlines()
    evals = demo.text_eval.read_text().splitlines()
    assert len(train) + len(evals) == SMALL["n_text_lines"]
    assert all(line.strip() == line and line for line in train + evals)
    assert sum(len(line.split()) for line in train) > 10 * len(train)


def test_sts_pairs_are_scored_by_the_share_of_slots_they_share(demo: DemoFiles) -> None:
    data = load_sts(demo.sts_eval)
    assert len(data.scores) == 500
    for first, second, score in zip(data.first, data.second, data.scores, strict=True):
        shared = sum(a == b for a, b in zip(slots(first), slots(second), strict=True))
        assert score == 5 * shared / 4, (first, second)
    assert set(data.scores) == {0.0, 1.25, 2.5, 3.75, 5.0}  # every grade occurs


def slots(sentence: str) -> tuple[str, ...]:
    """(who, moved, place, when) of "The {who} {moved} to the {place} {when}."."""
    found = re.fullmatch(r"The (\w+) (\w+) to the (\w+) (.+)\.", sentence)
    assert found is not None, sentence
    return found.groups()


# --------------------------------------------------------------------------- round trips


def test_loaders_read_what_the_generator_wrote(demo: DemoFiles) -> None:
    data = load_classification(demo.classification_train)
    assert data.label_names == ["negative", "positive"]
    assert data.source == str(demo.classification_train)
    first = json.loads(demo.classification_train.read_text().splitlines()[0])
    assert data.examples[0] == ClassificationExample(first["text"], data.label_names.index(first["label"]))
    assert len(data.examples) + len(load_classification(demo.classification_eval).examples) == 400

    qa = load_squad(demo.qa_train) + load_squad(demo.qa_eval)
    assert len(qa) == SMALL["n_qa"]
    assert len({example.id for example in qa}) == len(qa)
    for example in qa:
        answer = example.answers[0]
        assert example.context[answer.start : answer.start + len(answer.text)] == answer.text

    text = load_text(demo.text_train)
    assert text == demo.text_train.read_text().splitlines()


# --------------------------------------------------------------------------- standard formats


def test_sst2_style_tsv(tmp_path: Path) -> None:
    path = tmp_path / "sst2.tsv"
    path.write_text(
        'sentence\tlabel\nhide new secretions from the parental units \t0\nit \'s a "charming" film \t1\n\n'
        "contains no wit , only labored gags \t0\n",
        encoding="utf-8",
    )
    data = load_classification(path)
    assert data.label_names == ["negative", "positive"]
    assert [e.label for e in data.examples] == [0, 1, 0]
    assert data.examples[1].text == 'it \'s a "charming" film'


def test_csv_with_text_column_and_many_int_labels(tmp_path: Path) -> None:
    path = tmp_path / "topics.csv"
    path.write_text('label,text\n2,"hello, world"\n0,bye\n', encoding="utf-8")
    data = load_classification(path)
    assert data.label_names == ["LABEL_0", "LABEL_1", "LABEL_2"]
    assert data.examples == [ClassificationExample("hello, world", 2), ClassificationExample("bye", 0)]


def test_jsonl_string_and_int_labels(tmp_path: Path) -> None:
    strings = tmp_path / "s.jsonl"
    strings.write_text('{"text": "a", "label": "sports"}\n\n{"text": "b", "label": "arts"}\n')
    assert load_classification(strings).label_names == ["arts", "sports"]
    assert [e.label for e in load_classification(strings).examples] == [1, 0]
    ints = tmp_path / "i.jsonl"
    ints.write_text('{"text": "a", "label": 1}\n{"text": "b", "label": 0}\n')
    assert load_classification(ints).label_names == ["negative", "positive"]


def test_wikitext_style_text(tmp_path: Path) -> None:
    path = tmp_path / "wiki.txt"
    path.write_text(
        " \n = Valkyria Chronicles III = \n \n Senjō no Valkyria 3 is a game . \n"
        " = = Gameplay = = \n \n As with previous games , it = is = tactical . \n = = = Plot = = = \n",
        encoding="utf-8",
    )
    assert load_text(path) == [
        "Senjō no Valkyria 3 is a game .",
        "As with previous games , it = is = tactical .",
    ]
    assert len(load_text(path, skip_headings=False)) == 5
    assert is_heading(" = = Gameplay = = ") and not is_heading("= unbalanced = =")


def test_tiny_squad_file(tmp_path: Path) -> None:
    path = tmp_path / "squad.json"
    context = "Denver Broncos won Super Bowl 50 in 2016."
    doc = {
        "version": "1.1",
        "data": [
            {
                "title": "Super_Bowl_50",
                "paragraphs": [
                    {
                        "context": context,
                        "qas": [
                            {
                                "id": "q1",
                                "question": "Who won?",
                                "answers": [
                                    {"text": "Denver Broncos", "answer_start": 0},
                                    {"text": "Broncos", "answer_start": 7},
                                ],
                            },
                            {
                                "id": "q2",
                                "question": "When?",
                                "answers": [{"text": "2016", "answer_start": 36}],
                            },
                        ],
                    }
                ],
            }
        ],
    }
    path.write_text(json.dumps(doc), encoding="utf-8")
    examples = load_squad(path)
    assert [e.id for e in examples] == ["q1", "q2"]
    assert {e.title for e in examples} == {"Super_Bowl_50"}
    assert [a.text for a in examples[0].answers] == ["Denver Broncos", "Broncos"]
    assert examples[1].answers[0].start == 36 and examples[1].context == context


# --------------------------------------------------------------------------- malformed input


@pytest.mark.parametrize(
    ("name", "content", "where"),
    [
        ("bad.jsonl", '{"text": "ok", "label": "a"}\n{"text": "broken"\n', ":2:"),
        ("bad.jsonl", '{"text": "ok", "label": true}\n', ":1:"),
        ("bad.jsonl", '{"text": "ok", "label": 1}\n{"text": "x", "label": "a"}\n', ":2:"),
        ("bad.tsv", "sentence\tlabel\nfine\t1\ntoo\tmany\tfields\n", ":3:"),
        ("bad.tsv", "words\tlabel\nfine\t1\n", ":1:"),
        ("bad.csv", "text,label\n", ""),
        ("bad.txt", "text\tlabel\n", ""),
    ],
)
def test_malformed_classification_names_file_and_line(
    tmp_path: Path, name: str, content: str, where: str
) -> None:
    path = tmp_path / name
    path.write_text(content, encoding="utf-8")
    with pytest.raises(ValueError, match=re.escape(str(path) + where)):
        load_classification(path)


@pytest.mark.parametrize(
    "doc",
    [
        "{not json",
        json.dumps({"version": "1.1"}),
        json.dumps({"data": [{"title": "T", "paragraphs": [{"context": "abc", "qas": [{"id": "1"}]}]}]}),
        json.dumps(
            {
                "data": [
                    {
                        "title": "T",
                        "paragraphs": [
                            {
                                "context": "abc",
                                "qas": [
                                    {
                                        "id": "1",
                                        "question": "?",
                                        "answers": [{"text": "x", "answer_start": 0}],
                                    }
                                ],
                            }
                        ],
                    }
                ]
            }
        ),
    ],
)
def test_malformed_squad_names_file(tmp_path: Path, doc: str) -> None:
    path = tmp_path / "squad.json"
    path.write_text(doc, encoding="utf-8")
    with pytest.raises(ValueError, match=re.escape(str(path))):
        load_squad(path)


# --------------------------------------------------------------------------- splitting


def test_split_is_seeded_and_keeps_order() -> None:
    items = list(range(100))
    train, evals = split_examples(items, 0.2, seed=3)
    assert len(evals) == 20 and sorted(train + evals) == items
    assert train == sorted(train) and evals == sorted(evals)
    assert split_examples(items, 0.2, seed=3) == (train, evals)
    assert split_examples(items, 0.2, seed=4) != (train, evals)
    assert split_examples(items, 0.0, seed=3) == (items, [])
    with pytest.raises(ValueError):
        split_examples(items, 1.0, seed=0)


def test_grouped_split_keeps_groups_whole() -> None:
    items = [(f"article{i % 17}", i) for i in range(170)]
    train, evals = split_examples(items, 0.25, seed=0, group=lambda item: item[0])
    assert train and evals
    assert not {g for g, _ in train} & {g for g, _ in evals}
    assert len(train) + len(evals) == len(items)
    assert 30 <= len(evals) <= 50


def test_split_never_empties_a_side_when_possible() -> None:
    train, evals = split_examples(["a", "b"], 0.1, seed=0)
    assert len(train) == 1 and len(evals) == 1
    train, evals = split_examples(["a", "b", "c"], 0.9, seed=0, group=lambda _: "same")
    assert len(train) == 3 and evals == []


def test_a_squad_file_read_as_classification_says_which_task_it_is(tmp_path: Path) -> None:
    squad = tmp_path / "train.json"
    squad.write_text('{"data": []}')
    with pytest.raises(ValueError, match=r"'\.json'.*SQuAD-style QA: pass --task question-answering"):
        load_classification(squad)


def test_files_with_a_byte_order_mark_load_as_without(tmp_path: Path) -> None:
    """Excel writes UTF-8 with a BOM; it must not become part of the first header or JSON line."""
    tsv, jsonl = tmp_path / "bom.tsv", tmp_path / "bom.jsonl"
    tsv.write_text("sentence\tlabel\na fine film\t1\na dull film\t0\n", encoding="utf-8-sig")
    jsonl.write_text(
        '{"text": "a fine film", "label": "pos"}\n{"text": "dull", "label": "neg"}\n', "utf-8-sig"
    )
    assert [e.text for e in load_classification(tsv).examples] == ["a fine film", "a dull film"]
    assert load_classification(jsonl).label_names == ["neg", "pos"]


def test_a_file_that_is_not_utf8_is_named(tmp_path: Path) -> None:
    latin1 = tmp_path / "latin1.tsv"
    latin1.write_bytes("sentence\tlabel\nun film très bon\t1\n".encode("latin-1"))
    with pytest.raises(ValueError, match=r"latin1\.tsv: not UTF-8 text .*save it as UTF-8"):
        load_classification(latin1)
    with pytest.raises(ValueError, match=r"latin1\.tsv: not UTF-8 text"):
        load_text(latin1)
