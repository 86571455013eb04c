"""Teacher-labelled QA augmentation: questions asked of other paragraphs of their article, answered by the
teacher, written as a SQuAD file that training reads back."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
import torch
from transformers import BertConfig, BertForQuestionAnswering, BertTokenizerFast
from typer.testing import CliRunner

from common.spans import answer_text
from tests.tiny_models import tiny_bert_settings
from training import qa
from training.cli import app
from training.data.loaders import load_squad, squad_document
from training.data.types import Answer, QAExample
from training.qa_augment import article_pairings, augment
from training.tokenizer import save_tokenizer, train_wordpiece

ARTICLES = {
    "Harbor": [
        "The harbor was built in 1820 by a farmer named Ole. Ships brought salt and timber every spring.",
        "A library opened near the harbor in 1901. It held maps of the old river and the first station.",
        "The market by the harbor sold fish on Mondays and grain on Fridays until the bridge was built.",
    ],
    "Tower": [
        "The tower stands on the hill above the village. It was finished in 1755 after nine years of work.",
        "From the tower one sees the cinema, the school and the park where the garden fair is held.",
    ],
}


def _examples() -> list[QAExample]:
    out = []
    for title, contexts in ARTICLES.items():
        for p, context in enumerate(contexts):
            word = context.split()[3]
            out.append(
                QAExample(
                    id=f"{title}-{p}",
                    title=title,
                    question=f"What is said about {word}?",
                    context=context,
                    answers=[Answer(text=word, start=context.index(word))],
                )
            )
    return out


pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.fixture(scope="module")
def teacher() -> tuple[BertForQuestionAnswering, BertTokenizerFast]:
    tokenizer = train_wordpiece([c for cs in ARTICLES.values() for c in cs] + ["what is said about"], 300)
    torch.manual_seed(0)
    config = BertConfig(**tiny_bert_settings(len(tokenizer), pad_token_id=0))
    return BertForQuestionAnswering(config).eval(), tokenizer


def test_a_question_is_paired_only_with_other_paragraphs_of_its_article() -> None:
    examples = _examples()
    paired = article_pairings(examples, per_question=5, seed=0)
    by_id = {e.id: e for e in examples}
    for p in paired:
        source = by_id[p.id.split("/")[0]]
        assert p.context in ARTICLES[source.title] and p.context != source.context
        assert p.question == source.question and p.answers == []
    # Harbor questions have 2 other paragraphs, Tower questions 1: fewer than asked, never a repeat.
    assert len(paired) == 3 * 2 + 2 * 1
    assert len({(p.id.split("/")[0], p.context) for p in paired}) == len(paired)
    one = article_pairings(examples, per_question=1, seed=0)
    assert len(one) == len(examples)
    assert one == article_pairings(examples, per_question=1, seed=0)  # the seed decides


def test_augmented_answers_are_the_teachers_spans_and_the_file_reads_back(
    teacher: tuple[BertForQuestionAnswering, BertTokenizerFast], tmp_path: Path
) -> None:
    model, tokenizer = teacher
    train = tmp_path / "train.json"
    train.write_text(json.dumps(squad_document(_examples())))
    counts = augment(model, tokenizer, train, tmp_path / "aug.json", per_question=2, max_length=64)
    assert counts == {"original": 5, "augmented": 8}
    examples = load_squad(tmp_path / "aug.json")  # checks every answer lies where it says in its context
    originals = {e.id: e for e in _examples()}
    augmented = [e for e in examples if e.id not in originals]
    assert [e for e in examples if e.id in originals] == list(originals.values())  # kept as given
    assert len(augmented) == 8
    spans = qa.predict_spans(model, qa.QAData(augmented, "aug"), tokenizer, max_length=64)
    for example, span in zip(augmented, spans, strict=True):
        assert example.answers[0].text == answer_text(example.context, span)
        assert example.answers[0].start == span.start_char  # type: ignore[union-attr]


def test_the_cli_writes_a_file_distill_can_train_on(
    teacher: tuple[BertForQuestionAnswering, BertTokenizerFast], tmp_path: Path
) -> None:
    model, tokenizer = teacher
    model.save_pretrained(tmp_path / "teacher")
    save_tokenizer(tokenizer, tmp_path / "teacher")
    train = tmp_path / "train.json"
    train.write_text(json.dumps(squad_document(_examples())))
    out = tmp_path / "aug.json"
    args = ["augment-qa", "--teacher", str(tmp_path / "teacher"), "--train", str(train), "--out", str(out)]
    result = CliRunner().invoke(app, [*args, "--per-question", "1", "--max-length", "64"])
    assert result.exit_code == 0, result.output
    assert re.search(r"augment-qa: (\d+)/\1 windows \(100%\)", result.output), (
        result.output
    )  # how far, in a log
    assert "5 questions as given + 5 answered by the teacher" in " ".join(result.output.split())
    args = ["distill", "--task", "question-answering", "--teacher", str(tmp_path / "teacher")]
    args += ["--train", str(out), "--eval", str(train), "--out", str(tmp_path / "student"), "--layers", "1"]
    result = CliRunner().invoke(app, [*args, "--max-steps", "2", "--batch-size", "4", "--max-length", "64"])
    assert result.exit_code == 0, result.output
    report = json.loads((tmp_path / "student" / "distill_report.json").read_text())
    assert report["train"]["source"] == str(out) and len(load_squad(out)) == 10
