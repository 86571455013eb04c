"""A two-label relevance classifier as a cross-encoder: one logit, the log-odds of the relevant label.

A reranker is trained (and distilled) like any classifier, on (query, document) pairs labelled relevant or
not: the same batches, losses and agreement as sentiment. Rerankers are served with one label, whose sigmoid
is the relevance (HF's ms-marco cross-encoders, TEI's and vLLM's rerank): logit = z_relevant - z_other makes
sigmoid(logit) exactly softmax(z)[relevant], so the head is folded, not retrained.
"""

from __future__ import annotations

import json
import random
import shutil
from pathlib import Path

import torch
from transformers import AutoModelForSequenceClassification

HEADS = ("classifier", "score")  # BERT-family and decoder-family names of the final Linear


def relevant_id(label2id: dict[str, int], positive: str) -> int:
    """The id of `positive` among a two-label model's labels (case-insensitive)."""
    by_name = {name.lower(): int(i) for name, i in label2id.items()}
    if len(by_name) != 2:
        raise ValueError(
            f"a relevance classifier has two labels, this one {len(by_name)}: {sorted(label2id)}"
        )
    if positive.lower() not in by_name:
        raise ValueError(f"label {positive!r} is not among the model's {sorted(label2id)}")
    return by_name[positive.lower()]


def as_cross_encoder(model_dir: Path, out: Path, positive: str) -> Path:
    """`model_dir`'s two-label classifier written to `out` with one label, `positive`, whose logit is the
    log-odds of it; tokenizer and reports copied as they are."""
    model = AutoModelForSequenceClassification.from_pretrained(model_dir).eval()
    config = model.config
    keep = relevant_id(dict(config.label2id), positive)
    name = next((h for h in HEADS if isinstance(getattr(model, h, None), torch.nn.Linear)), None)
    if name is None:
        raise ValueError(f"{type(model).__name__}: no final Linear head named {' or '.join(HEADS)} to fold")
    head: torch.nn.Linear = getattr(model, name)
    other = 1 - keep
    folded = torch.nn.Linear(head.in_features, 1, bias=head.bias is not None)
    with torch.no_grad():
        folded.weight.copy_(head.weight[keep] - head.weight[other])
        if head.bias is not None:
            folded.bias.copy_(head.bias[keep] - head.bias[other])
    setattr(model, name, folded)
    label = config.id2label[keep]
    config.num_labels = 1
    config.id2label, config.label2id = {0: label}, {label: 0}
    model.save_pretrained(out)
    for path in model_dir.iterdir():  # the tokenizer's files and the run's reports
        if (
            path.is_file()
            and path.suffix in (".json", ".txt", ".md", ".model")
            and not (out / path.name).exists()
        ):
            shutil.copy(path, out / path.name)
    return out


def squad_pairs(squad: Path, out: Path, negatives: int, eval_articles: int, seed: int = 0) -> dict[str, int]:
    """Relevance pairs from SQuAD v1.1: each question with its own paragraph (`relevant`) and `negatives`
    other paragraphs of its article (`other`, drawn at random: the same topic, the hard case for a reranker).
    The last `eval_articles` articles are held out whole: eval.jsonl, and eval-squad.json (those articles as
    SQuAD, for ranking every paragraph)."""
    articles = json.loads(squad.read_text(encoding="utf-8"))["data"]
    if not 0 < eval_articles < len(articles):
        raise ValueError(f"{squad}: {len(articles)} articles; hold out between 1 and {len(articles) - 1}")
    rng = random.Random(seed)
    out.mkdir(parents=True, exist_ok=True)
    counts = {}
    for split, chosen in (("train", articles[:-eval_articles]), ("eval", articles[-eval_articles:])):
        rows = []
        for article in chosen:
            paragraphs = [p["context"] for p in article["paragraphs"]]
            for gold, paragraph in enumerate(article["paragraphs"]):
                others = [i for i in range(len(paragraphs)) if i != gold]
                for qa in paragraph["qas"]:
                    rows.append({"text": qa["question"], "text_pair": paragraphs[gold], "label": "relevant"})
                    for i in rng.sample(others, min(negatives, len(others))):
                        rows.append({"text": qa["question"], "text_pair": paragraphs[i], "label": "other"})
        if split == "train":
            rng.shuffle(rows)
        (out / f"{split}.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
        counts[split] = len(rows)
    (out / "eval-squad.json").write_text(json.dumps({"data": articles[-eval_articles:]}), encoding="utf-8")
    return counts
