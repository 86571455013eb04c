"""How good sentence embeddings are, without scipy: STS Spearman, nearest-neighbour retrieval, speed.

- STS: Spearman's rank correlation between the cosine similarity of each pair and its gold score (the
  SentEval / MTEB convention), ties given their average rank as scipy.stats.spearmanr does.
- Retrieval: for each query, the nearest candidate by cosine. Agreement is the share of queries where the
  student's nearest candidate is the teacher's (what a student serving a teacher's index must keep);
  recall@1 is the share where it is the gold candidate, when one is known.
- Speed: sentences/s of a PyTorch forward over a list of sentences, tokenisation included, as a client
  would see it from an in-process encoder.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Any

import torch
import torch.nn as nn
import torch.nn.functional as F
from transformers import PreTrainedTokenizerBase

from training.data.sentences import RetrievalData, StsData
from training.embeddings import SentenceEncoder, encode
from training.report import latency_ms

METRIC = "spearman"  # the main score of an embedding model on an STS set


def average_ranks(values: torch.Tensor) -> torch.Tensor:
    """1-based ranks of a 1-D tensor; equal values share the mean of the ranks they span (float64)."""
    order = torch.argsort(values, stable=True)
    _, inverse, counts = torch.unique_consecutive(values[order], return_inverse=True, return_counts=True)
    ends = counts.cumsum(0).double()  # the last rank each run of equal values spans
    mean_rank = ends - (counts.double() - 1) / 2
    ranks = torch.empty(len(values), dtype=torch.float64)
    ranks[order] = mean_rank[inverse]
    return ranks


def pearson(a: torch.Tensor, b: torch.Tensor) -> float:
    """Pearson's correlation (NaN when either side is constant: no ordering to agree on)."""
    a, b = a.double() - a.double().mean(), b.double() - b.double().mean()
    denominator = a.norm() * b.norm()
    return float((a @ b) / denominator) if denominator > 0 else float("nan")


def spearman(a: torch.Tensor | Sequence[float], b: torch.Tensor | Sequence[float]) -> float:
    """Spearman's rho: Pearson's correlation of the average ranks."""
    x, y = torch.as_tensor(a, dtype=torch.float64), torch.as_tensor(b, dtype=torch.float64)
    if x.shape != y.shape or x.dim() != 1 or len(x) < 2:
        raise ValueError(
            f"spearman needs two 1-D series of the same length >= 2, got {x.shape} and {y.shape}"
        )
    return pearson(average_ranks(x), average_ranks(y))


def pair_cosines(first: torch.Tensor, second: torch.Tensor) -> torch.Tensor:
    """Cosine similarity of row i of `first` with row i of `second`."""
    return F.cosine_similarity(first.float(), second.float(), dim=-1)


def nearest(
    queries: torch.Tensor, candidates: torch.Tensor, allowed: torch.Tensor | None = None
) -> torch.Tensor:
    """Index of each query's most cosine-similar candidate, among the `allowed` ones ([Q, C] bool)."""
    scores = F.normalize(queries.float(), dim=-1) @ F.normalize(candidates.float(), dim=-1).T
    if allowed is not None:
        scores = scores.masked_fill(~allowed, float("-inf"))
    return scores.argmax(-1)


def retrieval(
    student: tuple[torch.Tensor, torch.Tensor],
    teacher: tuple[torch.Tensor, torch.Tensor],
    gold: torch.Tensor | None = None,
    allowed: torch.Tensor | None = None,
) -> dict[str, float]:
    """(queries, candidates) embeddings of both models -> top-1 agreement and, with `gold` (the right
    candidate per query, -1 where none is known), recall@1 of each over the queries that have one.
    `allowed` ([Q, C] bool) limits each query to its own candidates (a SQuAD question to its article's).
    `mixed_*`: the student's queries against the teacher's candidates, as a student serves queries against
    an index its teacher built."""
    student_top, teacher_top = nearest(*student, allowed), nearest(*teacher, allowed)
    mixed_top = nearest(student[0], teacher[1], allowed)
    result = {
        "top1_agreement": float((student_top == teacher_top).double().mean()),
        "mixed_top1_agreement": float((mixed_top == teacher_top).double().mean()),
        "queries": len(student_top),
    }
    if gold is not None:
        known = gold >= 0
        if bool(known.any()):
            for name, top in (("student", student_top), ("teacher", teacher_top), ("mixed", mixed_top)):
                result[f"{name}_recall_at_1"] = float((top[known] == gold[known]).double().mean())
            result["gold_queries"] = int(known.sum())
    return result


def sentences_per_second(
    model: SentenceEncoder,
    tokenizer: PreTrainedTokenizerBase,
    sentences: Sequence[str],
    *,
    batch_size: int = 32,
    max_length: int | None = None,
) -> float:
    """Encoding throughput over `sentences` after one warm-up batch."""
    encode(model, tokenizer, sentences[:batch_size], batch_size=batch_size, max_length=max_length)
    started = time.perf_counter()
    encode(model, tokenizer, sentences, batch_size=batch_size, max_length=max_length)
    return len(sentences) / (time.perf_counter() - started)


class StsEval:
    """An STS set's distinct sentences with the teacher's embeddings of them, computed once: a score encodes
    each sentence once and reads both the Spearman correlation and the cosine to the teacher from it."""

    def __init__(
        self, data: StsData, teacher: SentenceEncoder, tokenizer: PreTrainedTokenizerBase, max_length: int
    ) -> None:
        self.data, self.tokenizer, self.max_length = data, tokenizer, max_length
        self.sentences = list(dict.fromkeys(data.first + data.second))
        index = {text: i for i, text in enumerate(self.sentences)}
        self.first = torch.tensor([index[t] for t in data.first])
        self.second = torch.tensor([index[t] for t in data.second])
        self.teacher = self.encode(teacher)

    def encode(self, model: SentenceEncoder) -> torch.Tensor:
        return encode(model, self.tokenizer, self.sentences, max_length=self.max_length)

    def __call__(self, model: nn.Module) -> dict[str, float]:
        assert isinstance(model, SentenceEncoder)
        embeddings = self.encode(model)
        cosines = pair_cosines(embeddings[self.first], embeddings[self.second])
        return {
            METRIC: spearman(cosines, self.data.scores),
            "teacher_cosine": float(pair_cosines(embeddings, self.teacher).mean()),
        }


def retrieval_scores(
    student: SentenceEncoder,
    teacher: SentenceEncoder,
    data: RetrievalData,
    tokenizer: PreTrainedTokenizerBase,
    max_length: int,
) -> dict[str, float]:
    """Top-1 agreement and recall@1 of both models on one retrieval set."""

    def both(model: SentenceEncoder) -> tuple[torch.Tensor, torch.Tensor]:
        return (
            encode(model, tokenizer, data.queries, max_length=max_length),
            encode(model, tokenizer, data.candidates, max_length=max_length),
        )

    allowed = torch.tensor(data.query_groups)[:, None] == torch.tensor(data.candidate_groups)[None, :]
    return retrieval(both(student), both(teacher), torch.tensor(data.gold), allowed)


def speed_report(
    teacher: SentenceEncoder,
    student: SentenceEncoder,
    tokenizer: PreTrainedTokenizerBase,
    sentences: list[str],
    max_length: int,
) -> tuple[dict[str, Any], dict[str, dict[str, float]]]:
    """Sentences/s of both in PyTorch (batches of 32, tokenisation included), and the forward latency per
    batch size on the CPU as every task's report has it (training.report.latency_ms)."""
    rates = {
        name: round(
            sentences_per_second(model, tokenizer, sentences, batch_size=32, max_length=max_length), 1
        )
        for name, model in (("teacher", teacher), ("student", student))
    }
    speed = {
        "sentences_per_s": rates,
        "speedup": round(rates["student"] / rates["teacher"], 3),
        "sentences": len(sentences),
        "batch_size": 32,
        "threads": torch.get_num_threads(),
    }
    sample = tokenizer(
        sentences[:32], padding=True, truncation=True, max_length=max_length, return_tensors="pt"
    )
    inputs = {"input_ids": sample["input_ids"], "attention_mask": sample["attention_mask"]}
    return speed, {"teacher": latency_ms(teacher, inputs), "student": latency_ms(student, inputs)}
