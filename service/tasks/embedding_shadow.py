"""Live agreement for an embedding student: a sampled share of the texts it embeds (DISTILSERVE_SHADOW_RATE)
is embedded by its teacher too, off the client's path, within service.cascade's shadow limits.

An embedding student is distilled to put each text where its teacher does (training.distill_embeddings:
MSE and cosine to the teacher's vectors), which is what lets it embed queries against an index its teacher
built. So the check is the cosine between the two vectors of a text: each checked text adds its cosine to
`distilserve_shadow_agreed_total` and one to `distilserve_shadow_compared_total`, and their ratio, the mean
cosine, sits beside the distillation report's `teacher_cosine` (the same mean over its eval sentences, which
the export writes into the manifest) and the drift alert 5 points below it. Every path that embeds texts
with a model goes through `embedded_rows`: /v1/embeddings, /embed, v2, and the query and document texts that
rerank, score, similarity and retrieval embed (those the passage cache already holds are not embedded again,
so not checked again).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

import numpy as np

from service.exchange import Exchange
from service.tasks.common import run_texts
from service.tasks.vectors import embedding_spec, row_cosines, stacked

if TYPE_CHECKING:
    from service.served import ServedModel
    from service.tasks.contract import Collaborators


async def embedded_rows(
    model: ServedModel,
    texts: Sequence[str],
    truncate: bool | None,
    c: Collaborators,
    x: Exchange,
    labels: Sequence[str] | None = None,
    timeout_s: float | None = None,
) -> tuple[list[dict[str, np.ndarray]], np.ndarray, int]:
    """Each text's graph outputs, its embedding (the rows of the spec's output) and the tokens read; where
    `model` is a student served with its teacher, a sampled share of the rows is checked by the teacher
    after the client has them."""
    timeout = c.settings.request_timeout_s if timeout_s is None else timeout_s
    with c.pairs.shadows.serving():
        outputs, tokens = await run_texts(model, texts, truncate, c.metrics, timeout, x, labels)
    rows = stacked(outputs, embedding_spec(model).output)
    x.answered_by = (model.name,)  # X-Distilserve-Answered-By, as every task's answers carry it
    _check_later(model, texts, truncate, rows, c, x)
    return outputs, rows, tokens


def _check_later(
    model: ServedModel,
    texts: Sequence[str],
    truncate: bool | None,
    rows: np.ndarray,
    c: Collaborators,
    x: Exchange,
) -> None:
    pair = c.pairs.pair_of(model)
    if pair is None or x.shadow or c.settings.shadow_rate <= 0:
        return
    picked = [i for i in range(len(texts)) if c.pairs.shadows.sampled()]
    if not picked:
        return
    mine = rows[picked]

    async def check() -> tuple[int, float]:
        shadow = Exchange(limits=x.limits, shadow=True)
        again, timeout = [texts[i] for i in picked], c.settings.request_timeout_s
        outputs, _ = await run_texts(pair.teacher, again, truncate, c.metrics, timeout, shadow)
        theirs = stacked(outputs, embedding_spec(pair.teacher).output)
        return len(picked), float(row_cosines(mine, theirs).sum())

    c.pairs.shadows.check_later(pair.shadow, len(picked), check)
