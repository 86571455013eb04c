"""The ranking cascade: a cross-encoder student ranks a query's documents, and its teacher reads again the few
it could not tell apart.

A search engine's reranker must read every candidate, which is what makes it dear; most of those candidates
are far from the best, and a student distilled from the reranker already says so. So the student scores all
documents, and those within the pair's margin of its best (when at least two are: one alone is not in
doubt) go to the teacher, which orders them first by its own scores; the rest follow in the student's
order. Where the teacher's best document is among those read again, the answer's best document is the
teacher's. The margin (a distance in relevance logits) is calibrated at export for a share of queries whose
best document is the teacher's (common.cascade's ranking half; `CascadeCalibration` "score-margin"), and
is overridden per request (`cascade_margin`) or per server (`DISTILSERVE_CASCADE_MARGIN`);
`DISTILSERVE_CASCADE=off` lets the student rank alone.

Live agreement: a sampled share of queries (`DISTILSERVE_SHADOW_RATE`) has the teacher score the documents it
did not read, off the client's path and within service.shadow's limits; a query agrees where the best
document served is the teacher's best, the calibration's `agreement` (which the drift alert compares it
with). Not the student's own best: how often that is the teacher's falls with every candidate a query brings
(SQuAD's pair: 94.7 % of 3-paragraph queries, 80.8 % of 10-paragraph ones), while the cascade's holds
(99.1 %, 98.0 %), so only the cascade's can be held to an export-time figure.
"""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from service.exchange import Exchange

if TYPE_CHECKING:  # the tasks import this room; the pairs and models come to it from them
    from service.cascade import Pair, Pairs
    from service.served import ServedModel

    # A model's raw score of some of the request's documents (by index): a relevance logit, or a cosine.
    Score = Callable[[ServedModel, Sequence[int], Exchange], Awaitable[list[float]]]


@dataclass(frozen=True)
class Ranked:
    """A query's documents ranked: each one's raw score, by the model named beside it, and the order."""

    scores: list[float]
    scored_by: list[str]
    order: list[int]  # document indices, best first


def best_first(scores: Sequence[float], among: Sequence[int]) -> list[int]:
    """`among` by score, highest first (ties: the earlier)."""
    return sorted(among, key=lambda i: -scores[i])


async def rank(
    pairs: Pairs,
    model: ServedModel,
    documents: int,
    score: Score,
    requested: float | None,
    x: Exchange,
    budget_ms: float | None = None,
) -> Ranked:
    """The documents ranked by `model`, or by the ranking cascade where it has a cross-encoder teacher;
    `budget_ms`: the request's own cascade budget (service.cascade's; default the server's)."""
    every = range(documents)
    pair = pairs.pair_of(model)
    if pair is None or not pair.ranking:  # `model` ranks (who embedded what, its scoring says in x)
        scores = await score(model, every, x)
        return Ranked(scores, [model.name] * documents, best_first(scores, every))
    teacher = pair.teacher
    if pairs.teacher_directly(pair, requested):  # at its calibration the cascade costs more than the teacher
        pair.inputs.inc(documents)
        theirs = await pairs.from_teacher(
            pair, documents, lambda: score(teacher, every, x), x, pairs.budget_from_now(budget_ms), budget_ms
        )
        if theirs is not None:
            pair.fallbacks.inc(documents)
            return _alone(teacher, theirs, x)
        return _alone(model, await score(model, every, x), x)  # the teacher could not take them
    began = time.monotonic()
    with pairs.shadows.serving():
        mine = await score(model, every, x)
    margin = pairs.margin(pair, requested)
    if margin is not None:  # counted where a cascade applies, as service.cascade counts its inputs
        pair.inputs.inc(documents)
    floor = max(mine) - (margin or 0.0)
    near = [] if margin is None else [i for i in every if mine[i] >= floor]
    if len(near) < 2:
        near = []
    scores, scored_by = list(mine), [model.name] * documents
    if near:
        theirs = await pairs.from_teacher(
            pair, len(near), lambda: score(teacher, near, x), x, began, budget_ms
        )
        if theirs is None:  # the teacher could not take them: the student's ranking stands
            near = []
        else:
            pair.fallbacks.inc(len(near))
            for i, s in zip(near, theirs, strict=True):
                scores[i], scored_by[i] = s, teacher.name
    read = set(near)
    order = best_first(scores, near) + best_first(mine, [i for i in every if i not in read])
    names = [model.name] if len(near) < documents else []
    x.answered_by = tuple(names + ([pair.teacher.name] if near else []))
    if documents > 1 and pairs.shadows.sampled():
        _check(pairs, pair, order[0], {i: scores[i] for i in near}, documents, score, x)
    return Ranked(scores, scored_by, order)


def _alone(model: ServedModel, scores: list[float], x: Exchange) -> Ranked:
    x.answered_by = (model.name,)
    return Ranked(scores, [model.name] * len(scores), best_first(scores, range(len(scores))))


def _check(
    pairs: Pairs, pair: Pair, served: int, known: dict[int, float], documents: int, score: Score, x: Exchange
) -> None:
    """The teacher scores the documents it has not read (off the client's path): is the best document
    served, `served`, the teacher's best?"""
    unread = [i for i in range(documents) if i not in known]

    async def check() -> tuple[int, int]:
        theirs = dict(known)
        if unread:
            shadow = Exchange(limits=x.limits, shadow=True)
            theirs.update(zip(unread, await score(pair.teacher, unread, shadow), strict=True))
        return 1, int(served == max(sorted(theirs), key=lambda i: theirs[i]))

    pairs.shadows.check_later(pair.shadow, 1, check)
