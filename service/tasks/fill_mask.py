"""Fill-mask: texts with one mask token -> the top-k tokens for it, with the completed sequences.

`POST /v1/fill-mask`; v2: TEXT BYTES [b] -> TOKEN_STR BYTES [b, k], TOKEN INT64 [b, k], SCORE FP32 [b, k],
SEQUENCE BYTES [b, k] (the tokens decoded with the mask filled), MODEL BYTES [b] (the model that answered);
parameter top_k (default 5). The engine
sends back only the logits at the mask position, not a vocabulary-wide row per token.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

import numpy as np
from pydantic import Field
from typing_extensions import TypedDict  # pydantic reads only this one's fields on Python 3.11

from service.exchange import Exchange
from service.tasks.classification import softmax
from service.tasks.common import (
    answered_by,
    answering,
    check_chars,
    enforce_window,
    passed,
    per_text_endpoint,
    run_all,
    strings,
    tokenizing,
    validated,
)
from service.tasks.contract import (
    ANSWERED_BY,
    CascadeRequest,
    Endpoint,
    EngineAsks,
    InvalidInputError,
    ServedTask,
    Texts,
    V2Interface,
    V2Job,
    tensor,
)

if TYPE_CHECKING:
    from service.manifest import Manifest
    from service.metrics import Metrics
    from service.served import ServedModel

NAME = "fill-mask"


class FillMaskRequest(CascadeRequest):
    inputs: Texts = Field(
        ..., description="Text(s) with exactly one mask token each.", examples=["I loved this [MASK]."]
    )
    top_k: int = Field(5, ge=1, le=100, description="How many candidate tokens, best first.")


class Candidate(TypedDict):
    token: int
    token_str: str
    score: float
    sequence: str
    model: str  # the model that answered (a student, or its teacher for an unsure input)


def mask_positions(input_ids: np.ndarray, mask_token_id: int) -> np.ndarray:
    return np.flatnonzero(input_ids == mask_token_id)


def top_tokens(logits: np.ndarray, top_k: int) -> list[tuple[int, float]]:
    """(token id, probability) of the `top_k` most likely tokens of one position, best first."""
    probs = softmax(logits.astype(np.float64))
    k = min(max(1, top_k), probs.shape[-1])
    best = np.argpartition(-probs, k - 1)[:k]
    best = best[np.argsort(-probs[best], kind="stable")]
    return [(int(i), float(probs[i])) for i in best]


async def fill_mask(
    model: ServedModel, texts: Sequence[str], top_k: int, metrics: Metrics, timeout_s: float, x: Exchange
) -> list[list[Candidate]]:
    mask_id = model.manifest.special_tokens.mask
    assert mask_id is not None  # the manifest schema requires it for fill-mask
    mask_token = model.encoder.id_to_token(mask_id) or "[MASK]"
    check_chars(texts, x)
    with tokenizing(metrics, model, x):
        encoded = model.encoder.encode(texts)
    enforce_window(encoded, model.encoder.max_length, x)
    for i, (text, e) in enumerate(zip(texts, encoded, strict=True)):
        found = len(mask_positions(e.input_ids, mask_id))
        where = f"input {i}" if len(texts) > 1 else "the input"
        if found == 0 and mask_token in text:
            raise InvalidInputError(
                f"{where}: {mask_token} lies past the model's {model.encoder.max_length} tokens"
            )
        if e.truncated:  # a mask cut off with the text's end still makes one too many
            found = max(found, text.count(mask_token))
        if found != 1:
            raise InvalidInputError(f"{where} has {found} {mask_token} tokens; exactly one is supported")
    outputs = await run_all(model, encoded, timeout_s, x)
    results = []
    for e, out in zip(encoded, outputs, strict=True):
        position = int(mask_positions(e.input_ids, mask_id)[0])
        candidates = []
        for token_id, score in top_tokens(out["logits"][0], top_k):
            ids = e.input_ids.copy()
            ids[position] = token_id
            candidates.append(
                Candidate(
                    token=token_id,
                    token_str=model.encoder.decode([token_id]),
                    score=score,
                    sequence=model.encoder.decode(ids.tolist()),
                    model=model.name,
                )
            )
        results.append(candidates)
    return results


async def infer(job: V2Job) -> dict[str, np.ndarray]:
    texts = job.texts["TEXT"]
    body = validated(
        FillMaskRequest, {"inputs": texts, **passed(job, TASK.v2.parameters)}, {"inputs": "TEXT"}
    )
    answer = answering(fill_mask, body.top_k, job.c.metrics, job.timeout_s)
    rows = await job.c.pairs.answer(
        job.model, texts, answer, body.cascade_threshold, job.x, body.cascade_budget_ms
    )
    shape = (len(rows), len(rows[0]))
    return {
        "TOKEN_STR": strings([c["token_str"] for row in rows for c in row]).reshape(shape),
        "TOKEN": np.array([[c["token"] for c in row] for row in rows], dtype=np.int64).reshape(shape),
        "SCORE": np.array([[c["score"] for c in row] for row in rows], dtype=np.float32).reshape(shape),
        "SEQUENCE": strings([c["sequence"] for row in rows for c in row]).reshape(shape),
        "MODEL": answered_by([row[0] for row in rows]),
    }


def mask_token(manifest: Manifest) -> int | None:
    return manifest.special_tokens.mask


TASK = ServedTask(
    name=NAME,
    endpoints=(
        Endpoint(
            "/v1/fill-mask",
            FillMaskRequest,
            list[Candidate] | list[list[Candidate]],
            "Fill the mask: one text -> a list of candidates; a list of texts -> a list per text.",
            per_text_endpoint(NAME, fill_mask),
        ),
    ),
    v2=V2Interface(
        inputs=("TEXT",),
        outputs=(
            tensor("TOKEN_STR", "BYTES", 2),
            tensor("TOKEN", "INT64", 2),
            tensor("SCORE", "FP32", 2),
            tensor("SEQUENCE", "BYTES", 2),
            ANSWERED_BY,
        ),
        parameters=("top_k", "cascade_threshold", "cascade_budget_ms"),
        run=infer,
    ),
    engine=EngineAsks(gather_token=mask_token),
)
