"""A draft whose output head is cut to the vocabulary's first ids plus the running contexts' (common/
draft_head.py): it proposes only tokens it scores, is fed the rows' context ids when it drafts and none when
it prefills, and the teacher's text (greedy) and distribution (sampled) stay its own. (Served:
tests/service/generation/test_speculative_served.py's draft variant is cut.)"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest

from common.draft_head import DraftHead
from service.drafts import cut_head
from service.generation.runner import DecoderRunner, StepResult
from service.generation.speculative import SpeculativeRunner
from service.manifest import GenerationLayout
from service.repository import scan_repository
from service.runtime import ort_engine_factory
from service.settings import Settings
from tests.service.generation.test_speculative import (
    REQUESTS,
    generate,
    one_distribution,
    sampled_openings,
)
from tests.tiny_models import export_lm_pair

HEAD_TOKENS = 16  # of the tiny vocabulary's 355: most tokens are scored only when a context holds them


@pytest.fixture(scope="module")
def cut_pair(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("lm-cut-pair")
    pair = export_lm_pair(
        root, self_student="lm-self", student_variants=("fp32", "draft"), draft_head_tokens=HEAD_TOKENS
    )
    return pair[0]


class Recording(DecoderRunner):
    """The draft, recording the context fed with each call, and whether the call was a prefill's."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.fed: list[tuple[bool, np.ndarray]] = []  # (a prefill's call, the context ids fed)
        self._prefilling = False

    def prefill(self, *args: Any, **kwargs: Any) -> dict[int, int]:
        self._prefilling = True
        try:
            return super().prefill(*args, **kwargs)
        finally:
            self._prefilling = False

    def prefill_aside(self, *args: Any, **kwargs: Any) -> None:
        self._prefilling = True
        try:
            super().prefill_aside(*args, **kwargs)
        finally:
            self._prefilling = False

    def _run(self, *args: Any, **kwargs: Any) -> dict[str, Any]:
        self.fed.append((self._prefilling, self.context.copy()))
        return super()._run(*args, **kwargs)


Parts = dict[str, tuple[Any, GenerationLayout, DraftHead | None]]


@pytest.fixture(scope="module")
def parts(cut_pair: Path) -> Parts:
    """The teacher's fp32 session, and each student's draft variant with its cut head, by name."""
    out: Parts = {}
    for version in scan_repository(cut_pair).versions:
        m = version.manifest
        assert m.generation is not None
        draft = m.name != "lm-teacher"
        head = cut_head(m) if draft else None
        assert not draft or (head is not None and (head.tokens, head.vocabulary) == (HEAD_TOKENS, 355))
        engine = ort_engine_factory(version, "draft" if draft else "fp32", Settings())
        out[m.name] = (engine, m.generation, head)
    return out


def runner(parts: Parts, name: str) -> DecoderRunner:
    engine, layout, head = parts[name]
    return DecoderRunner(engine, layout, head=head)


def test_greedy_text_is_the_teachers_and_the_draft_scores_the_rows_context(parts: Parts) -> None:
    alone = generate(runner(parts, "lm-teacher"), REQUESTS)
    engine, layout, head = parts["lm"]
    draft = Recording(engine, layout, head=head)
    assert generate(SpeculativeRunner(runner(parts, "lm-teacher"), draft, 3, 64), REQUESTS) == alone
    prefills = [context for prefill, context in draft.fed if prefill]
    steps = [context for prefill, context in draft.fed if not prefill]
    assert prefills and all(len(context) == 0 for context in prefills)  # a prefill's logits go unused
    fed = set(np.concatenate(steps).tolist())
    assert fed and min(fed) >= HEAD_TOKENS  # only what the head does not score by itself
    assert {t for _, prompt, _ in REQUESTS for t in prompt if t >= HEAD_TOKENS} <= fed


def test_its_proposals_are_the_ids_its_columns_score(parts: Parts) -> None:
    """The teacher drafted by its own 8-bit copy, cut: nearly every draft is kept (0.97 here; read as column
    numbers instead of token ids, 0.01)."""
    results: list[StepResult] = []
    speculative = SpeculativeRunner(runner(parts, "lm-teacher"), runner(parts, "lm-self"), 3, 64)
    generate(speculative, REQUESTS, results=results)
    drafted, accepted = sum(r.drafted for r in results), sum(r.accepted for r in results)
    assert drafted > 50 and accepted >= 0.9 * drafted


def test_sampled_text_keeps_the_teachers_distribution(parts: Parts) -> None:
    """The draft's distribution is zero outside the ids it scores; the accept/reject rule uses that same
    distribution, so the teacher's stays exact (chi-square of homogeneity, p = 0.001)."""
    speculative = SpeculativeRunner(runner(parts, "lm-teacher"), runner(parts, "lm"), 2, 64)
    drafted = sampled_openings(speculative, range(1200))
    alone = sampled_openings(runner(parts, "lm-teacher"), range(10_000, 11_200))
    assert one_distribution(drafted, alone)
