"""Text classification: texts -> the top-k `{label, score}` pairs of each (the HF pipeline's shape).

`POST /v1/classify`; v2: TEXT BYTES [b] -> LABEL BYTES [b], SCORE FP32 [b] (top-1 probability), SCORES FP32
[b, num_labels] (every label's probability, in the manifest's label order). The engine adds the class
probabilities once per batch.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

import numpy as np
from pydantic import Field
from typing_extensions import TypedDict  # pydantic reads only this one's fields on Python 3.11

from service.exchange import Exchange
from service.tasks.common import (
    answering,
    check_chars,
    enforce_window,
    label_order,
    passed,
    per_text_endpoint,
    run_all,
    strings,
    tokenizing,
    validated,
)
from service.tasks.contract import (
    CascadeRequest,
    Endpoint,
    EngineAsks,
    ServedTask,
    Texts,
    V2Interface,
    V2Job,
    tensor,
)

if TYPE_CHECKING:
    from service.metrics import Metrics
    from service.served import ServedModel

NAME = "text-classification"


class ClassifyRequest(CascadeRequest):
    inputs: Texts = Field(
        ..., description="One text or a list of texts.", examples=["I loved this film, it was wonderful"]
    )
    top_k: int = Field(1, ge=1, le=1000, description="How many labels per input, best first.")


class LabelScore(TypedDict):
    label: str
    score: float
    model: str  # the model that answered (a student, or its teacher for an unsure input)


def softmax(logits: np.ndarray) -> np.ndarray:
    shifted = logits - logits.max(axis=-1, keepdims=True)
    e = np.exp(shifted)
    return e / e.sum(axis=-1, keepdims=True)


def with_probabilities(outputs: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """A batch's outputs with its class probabilities beside the logits.

    Run on the engine thread, once per batch: a softmax per row on the event loop cost ~30 us a request
    (numpy's per-call overhead on a row of two numbers), this costs about that per batch, off the loop.
    """
    return {**outputs, "probabilities": softmax(outputs["logits"].astype(np.float64))}


def top_labels(probabilities: np.ndarray, labels: dict[int, str], top_k: int, model: str) -> list[LabelScore]:
    """Best `top_k` labels of one row of probabilities, highest first (ties: lower label id first);
    top_k beyond the labels is clamped."""
    scores: list[float] = probabilities.tolist()
    order = sorted(range(len(scores)), key=scores.__getitem__, reverse=True)[: max(1, top_k)]
    return [LabelScore(label=labels.get(i, f"LABEL_{i}"), score=scores[i], model=model) for i in order]


async def classify(
    model: ServedModel, texts: Sequence[str], top_k: int, metrics: Metrics, timeout_s: float, x: Exchange
) -> list[list[LabelScore]]:
    check_chars(texts, x)
    with tokenizing(metrics, model, x):
        encoded = model.encoder.encode(texts)
    enforce_window(encoded, model.encoder.max_length, x)
    outputs = await run_all(model, encoded, timeout_s, x)
    labels = model.manifest.labels
    return [top_labels(o["probabilities"], labels, top_k, model.name) for o in outputs]


async def infer(job: V2Job) -> dict[str, np.ndarray]:
    texts = job.texts["TEXT"]
    body = validated(
        ClassifyRequest, {"inputs": texts, **passed(job, TASK.v2.parameters)}, {"inputs": "TEXT"}
    )
    labels = label_order(job.model)
    answer = answering(classify, len(labels), job.c.metrics, job.timeout_s)
    rows = await job.c.pairs.answer(job.model, texts, answer, body.cascade_threshold, job.x)
    scores = [{r["label"]: r["score"] for r in row} for row in rows]
    return {
        "LABEL": strings([row[0]["label"] for row in rows]),
        "SCORE": np.array([row[0]["score"] for row in rows], dtype=np.float32),
        "SCORES": np.array([[s.get(label, 0.0) for label in labels] for s in scores], dtype=np.float32),
    }


TASK = ServedTask(
    name=NAME,
    endpoints=(
        Endpoint(
            "/v1/classify",
            ClassifyRequest,
            list[LabelScore] | list[list[LabelScore]],
            "Classify one text (-> a list of {label, score}) or a list of texts (-> a list per text).",
            per_text_endpoint(NAME, classify),
        ),
    ),
    v2=V2Interface(
        inputs=("TEXT",),
        outputs=(tensor("LABEL", "BYTES"), tensor("SCORE", "FP32"), tensor("SCORES", "FP32", 2)),
        parameters=("cascade_threshold",),
        run=infer,
    ),
    engine=EngineAsks(finish=with_probabilities),
)
