"""Relevance classifiers on pairs of texts, and their fold into a one-label cross-encoder: pair files load
(JSONL `text_pair`, GLUE's sentence1/sentence2), batches hold both segments as HF tokenizes a pair, a
teacher learns on them, and the folded reranker scores sigmoid(logit) = the classifier's probability of the
relevant label, in PyTorch and served."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch
from fastapi.testclient import TestClient
from transformers import AutoModelForSequenceClassification, AutoTokenizer, BertTokenizerFast
from typer.testing import CliRunner

from training import classification
from training.cli import app
from training.data.loaders import load_classification
from training.models import load_teacher
from training.recipes import TrainConfig
from training.relevance import as_cross_encoder
from training.tokenizer import train_wordpiece
from training.trainer import train

QUERIES = ["who founded acme", "when did the war end", "what is a film"]
DOCUMENTS = ["john smith founded acme", "the war ended in 1945", "a film is a moving picture"]


def pair_rows() -> list[dict[str, object]]:
    """Each query with its own document (relevant) and the others (not)."""
    return [
        {"text": q, "text_pair": d, "label": "relevant" if i == j else "other"}
        for i, q in enumerate(QUERIES)
        for j, d in enumerate(DOCUMENTS)
    ]


@pytest.fixture(scope="module")
def tokenizer() -> BertTokenizerFast:
    return train_wordpiece(QUERIES + DOCUMENTS, vocab_size=120)


def write_jsonl(path: Path, rows: list[dict[str, object]]) -> Path:
    path.write_text("\n".join(json.dumps(r) for r in rows) + "\n", encoding="utf-8")
    return path


def test_pair_files_load_as_jsonl_and_as_glue_tables(tmp_path: Path) -> None:
    data = load_classification(write_jsonl(tmp_path / "pairs.jsonl", pair_rows()))
    assert data.label_names == ["other", "relevant"]
    assert (data.examples[0].text, data.examples[0].pair, data.examples[0].label) == (
        QUERIES[0],
        DOCUMENTS[0],
        1,
    )
    table = tmp_path / "pairs.tsv"
    table.write_text("sentence1\tsentence2\tlabel\nwho\tjohn\t1\nwhen\t1950\t0\n", encoding="utf-8")
    assert [(e.text, e.pair, e.label) for e in load_classification(table).examples] == [
        ("who", "john", 1),
        ("when", "1950", 0),
    ]
    mixed = write_jsonl(tmp_path / "mixed.jsonl", [*pair_rows()[:2], {"text": "alone", "label": "other"}])
    with pytest.raises(ValueError, match=r"mixed.jsonl:3: no second text, where other rows have one"):
        load_classification(mixed)
    bad = write_jsonl(tmp_path / "bad.jsonl", [{"text": "a", "text_pair": 3, "label": "other"}])
    with pytest.raises(ValueError, match="'text_pair' must be a string"):
        load_classification(bad)


def test_a_batch_of_pairs_is_what_hf_tokenizes_for_a_pair(
    tokenizer: BertTokenizerFast, tmp_path: Path
) -> None:
    data = load_classification(write_jsonl(tmp_path / "pairs.jsonl", pair_rows()))
    features = classification.encode(data, tokenizer, {"other": 0, "relevant": 1}, max_length=10)
    expected = tokenizer(QUERIES[0], DOCUMENTS[0], truncation="longest_first", max_length=10)
    assert features[0]["input_ids"] == expected["input_ids"]
    assert features[0]["token_type_ids"] == expected["token_type_ids"] and 1 in expected["token_type_ids"]


@pytest.fixture(scope="module")
def relevance_model(tokenizer: BertTokenizerFast, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A tiny teacher trained on the pairs until it tells each query's document from the others."""
    torch.manual_seed(0)
    root = tmp_path_factory.mktemp("relevance")
    data = load_classification(write_jsonl(root / "pairs.jsonl", pair_rows() * 8))
    model = load_teacher(
        "bert-tiny", "text-classification", data.label_names, tokenizer_vocab_size=len(tokenizer)
    )
    loader = classification.make_loader(
        data, tokenizer, model.config, batch_size=9, max_length=24, shuffle=True
    )
    train(model, loader, classification.teacher_step, TrainConfig(epochs=20, lr=3e-3, batch_size=9, seed=0))
    assert classification.evaluate(model, data, tokenizer, max_length=24)["accuracy"] == 1.0
    model.save_pretrained(root / "model")
    tokenizer.save_pretrained(root / "model")
    return root / "model"


def probabilities(model_dir: Path) -> np.ndarray:
    """PyTorch: the classifier's probability of `relevant` for every (query, document), [queries, docs]."""
    model = AutoModelForSequenceClassification.from_pretrained(model_dir).eval()
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    pairs = [(q, d) for q in QUERIES for d in DOCUMENTS]
    encoded = tokenizer([q for q, _ in pairs], [d for _, d in pairs], padding=True, return_tensors="pt")
    with torch.no_grad():
        logits = model(**encoded).logits
    if logits.shape[-1] == 1:
        return torch.sigmoid(logits[:, 0]).reshape(len(QUERIES), -1).numpy()
    relevant = model.config.label2id["relevant"]
    return logits.softmax(-1)[:, relevant].reshape(len(QUERIES), -1).numpy()


def test_the_fold_keeps_the_probability_of_relevance(relevance_model: Path, tmp_path: Path) -> None:
    folded = as_cross_encoder(relevance_model, tmp_path / "ranker", "Relevant")
    config = AutoModelForSequenceClassification.from_pretrained(folded).config
    assert config.num_labels == 1 and config.id2label == {0: "relevant"}
    np.testing.assert_allclose(probabilities(folded), probabilities(relevance_model), atol=1e-6)
    assert (probabilities(folded).argmax(1) == np.arange(len(QUERIES))).all()  # each query's own document

    with pytest.raises(ValueError, match="'nope' is not among"):
        as_cross_encoder(relevance_model, tmp_path / "x", "nope")
    with pytest.raises(ValueError, match="two labels, this one 1"):
        as_cross_encoder(folded, tmp_path / "y", "relevant")


def test_the_cli_folds_and_the_service_ranks_with_it(relevance_model: Path, tmp_path: Path) -> None:
    from export.pipeline import export_model
    from service.app import create_app
    from service.settings import Settings

    out = tmp_path / "ranker"
    result = CliRunner().invoke(
        app, ["cross-encoder", str(relevance_model), "--out", str(out), "--relevant", "relevant"]
    )
    assert result.exit_code == 0, result.output
    pairs = write_jsonl(tmp_path / "eval.jsonl", pair_rows())  # the gate reads them as pairs
    exported = export_model(
        out, "text-classification", "ranker", tmp_path / "models", ("fp32",), eval_data=pairs
    )
    assert exported.version_dir is not None
    parity = json.loads((exported.version_dir / "manifest.json").read_text())["variants"]["fp32"]["parity"]
    assert parity["eval_rows"] == len(pair_rows()) and parity["top1_agreement"] == 1.0
    expected = probabilities(relevance_model)
    with TestClient(create_app(Settings(model_repository=tmp_path / "models"))) as client:
        for i, query in enumerate(QUERIES):
            ranks = client.post("/rerank", json={"query": query, "texts": DOCUMENTS}).json()
            assert ranks[0]["index"] == i
            np.testing.assert_allclose(
                [r["score"] for r in sorted(ranks, key=lambda r: r["index"])], expected[i], atol=1e-5
            )
    refused = CliRunner().invoke(
        app, ["cross-encoder", str(relevance_model), "--out", str(tmp_path / "z"), "--relevant", "x"]
    )
    assert refused.exit_code == 1 and "'x' is not among" in refused.output


def test_squad_pairs_hold_out_whole_articles_and_pair_each_question_with_its_paragraph(
    tmp_path: Path,
) -> None:
    from training.relevance import squad_pairs

    def article(title: str, paragraphs: int) -> dict[str, object]:
        return {
            "title": title,
            "paragraphs": [
                {
                    "context": f"{title} paragraph {p}",
                    "qas": [{"id": f"{title}{p}", "question": f"{title} q{p}?"}],
                }
                for p in range(paragraphs)
            ],
        }

    squad = tmp_path / "squad.json"
    squad.write_text(
        json.dumps({"data": [article("a", 4), article("b", 3), article("c", 2)]}), encoding="utf-8"
    )
    counts = squad_pairs(squad, tmp_path / "pairs", negatives=2, eval_articles=1)
    train = load_classification(tmp_path / "pairs" / "train.jsonl")
    evals = load_classification(tmp_path / "pairs" / "eval.jsonl")
    assert counts == {"train": 7 * 3, "eval": 2 * 2}  # each question: its paragraph and min(2, others)
    assert {e.text[0] for e in train.examples} == {"a", "b"} and {e.text[0] for e in evals.examples} == {"c"}
    for e in train.examples:
        own = e.pair == e.text.replace(" q", " paragraph ").rstrip("?")
        assert own == (train.label_names[e.label] == "relevant")
        assert e.pair is not None and e.pair[0] == e.text[0]  # negatives come from the same article
    held = json.loads((tmp_path / "pairs" / "eval-squad.json").read_text())
    assert [a["title"] for a in held["data"]] == ["c"]
    with pytest.raises(ValueError, match="hold out between 1 and 2"):
        squad_pairs(squad, tmp_path / "x", negatives=1, eval_articles=3)
