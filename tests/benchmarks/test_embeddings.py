"""benchmarks.embeddings' served retrieval: SQuAD questions against their article's paragraphs from vectors
the service gives, the student's questions against the teacher's paragraphs among them, checked against
the same figures from PyTorch's vectors."""

from __future__ import annotations

import json
import random
from pathlib import Path
from typing import Any

import pytest
import torch

from benchmarks.embeddings import served_retrieval
from tests.conftest import EMBEDDING_STUDENT, EMBEDDING_TEACHER
from tests.service.live_server import live_server
from tests.service.tasks.test_embeddings import torch_embeddings
from tests.tiny_models import CORPUS
from training.data.sentences import squad_retrieval
from training.embedding_metrics import retrieval


def write_squad(path: Path) -> Path:
    """Two articles of four paragraphs, each question a few of its paragraph's words."""
    rng = random.Random(3)
    words = " ".join(CORPUS).lower().replace(".", "").replace(",", "").split()
    articles = []
    for a in range(2):
        paragraphs = []
        for p in range(4):
            context = " ".join(rng.choice(words) for _ in range(14))
            question = " ".join(context.split()[rng.randrange(0, 8) :][:5])
            answer = {"text": context.split()[0], "answer_start": 0}
            qa = {"id": f"{a}-{p}", "question": question, "answers": [answer]}
            paragraphs.append({"context": context, "qas": [qa]})
        articles.append({"title": f"article {a}", "paragraphs": paragraphs})
    path.write_text(json.dumps({"version": "1.1", "data": articles}), encoding="utf-8")
    return path


def test_served_retrieval_is_pytorchs_with_mixed_vectors(
    embedding_pair: dict[str, Any], tmp_path: Path
) -> None:
    squad = write_squad(tmp_path / "squad.json")
    with live_server(embedding_pair["repository"]) as server:
        served = served_retrieval(server.base_url, EMBEDDING_STUDENT, EMBEDDING_TEACHER, squad)
    data = squad_retrieval(squad)

    def vectors(model: str) -> tuple[torch.Tensor, torch.Tensor]:
        return tuple(  # type: ignore[return-value]
            torch.from_numpy(torch_embeddings(embedding_pair[model], texts))
            for texts in (data.queries, data.candidates)
        )

    allowed = torch.tensor(data.query_groups)[:, None] == torch.tensor(data.candidate_groups)[None, :]
    expected = retrieval(vectors("student"), vectors("teacher"), torch.tensor(data.gold), allowed)
    assert served.keys() == expected.keys() and served["queries"] == 8
    for key, value in expected.items():
        assert served[key] == pytest.approx(value), key
