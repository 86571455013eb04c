"""Text classification: texts -> the top-k `{label, score}` pairs of each (the HF pipeline's shape).

`POST /v1/classify`; `POST /predict`, text-embeddings-inference's: `inputs` one text, a pair of texts read
together as one sequence (`["query", "document"]`, a cross-encoder's input), or a batch of either
(`[["text"], ["query", "document"]]`), `raw_scores`, `truncate` -> every label's `{label, score}`, best first;
what TEI's validation refuses is a 413, as TEI answers. A model of one label (a cross-encoder's relevance)
scores by its sigmoid, as the HF pipeline does; rerank and score read such models (service.tasks.similarity).
v2: TEXT BYTES [b] -> LABEL BYTES [b], SCORE FP32 [b] (top-1 probability), SCORES FP32 [b, num_labels]
(every label's probability, in the manifest's label order), MODEL BYTES [b] (the model that answered). The
engine adds the class probabilities once per batch.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

import numpy as np
from pydantic import Field
from typing_extensions import TypedDict  # pydantic reads only this one's fields on Python 3.11

from service.exchange import Exchange
from service.tasks.common import (
    TextOrPair,
    answered_by,
    answering,
    label_order,
    passed,
    per_text_endpoint,
    run_texts,
    strings,
    validated,
)
from service.tasks.contract import (
    ANSWERED_BY,
    CascadeRequest,
    Collaborators,
    Endpoint,
    EngineAsks,
    InvalidInputError,
    ServedTask,
    TeiRequest,
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


def sigmoid(logits: np.ndarray) -> np.ndarray:
    return 0.5 * (1.0 + np.tanh(0.5 * logits))  # 1 / (1 + e^-x) without overflow warnings


def with_probabilities(outputs: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """A batch's outputs with its class probabilities beside the logits: a softmax over the labels, or for a
    model of one label (a cross-encoder's relevance, a regression) its sigmoid, as the HF pipeline applies.

    Run on the engine thread, once per batch: a softmax per row on the event loop cost ~30 us a request
    (numpy's per-call overhead on a row of two numbers), this costs about that per batch, off the loop.
    """
    logits = outputs["logits"].astype(np.float64)
    return {**outputs, "probabilities": sigmoid(logits) if logits.shape[-1] == 1 else softmax(logits)}


def top_labels(probabilities: np.ndarray, labels: dict[int, str], top_k: int, model: str) -> list[LabelScore]:
    """Best `top_k` labels of one row of probabilities, highest first (ties: lower label id first);
    top_k beyond the labels is clamped."""
    scores: list[float] = probabilities.tolist()
    order = sorted(range(len(scores)), key=scores.__getitem__, reverse=True)[: max(1, top_k)]
    return [LabelScore(label=labels.get(i, f"LABEL_{i}"), score=scores[i], model=model) for i in order]


async def classify(
    model: ServedModel, texts: Sequence[str], top_k: int, metrics: Metrics, timeout_s: float, x: Exchange
) -> list[list[LabelScore]]:
    outputs, _ = await run_texts(model, texts, None, metrics, timeout_s, x)
    labels = model.manifest.labels
    return [top_labels(o["probabilities"], labels, top_k, model.name) for o in outputs]


# -- text-embeddings-inference's /predict -----------------------------------------------------------------


class PredictRequest(TeiRequest):
    """TEI's /predict request; `model` and the cascade's fields are distilserve's own."""

    inputs: str | list[str] | list[list[str]] = Field(
        ...,
        description='One text, a pair of texts read together (["query", "document"]: a cross-encoder\'s '
        'input), or a batch of either as TEI writes it: [["text"], ["query", "document"], ...].',
        examples=["I loved this film"],
    )
    raw_scores: bool = Field(False, description="Each label's logit instead of its probability.")
    model: str | None = Field(None, description="Model name; default: the first model serving the task.")
    cascade_threshold: float | None = Field(
        None, ge=0.0, le=1.0, description="As /v1/classify's: a student's unsure texts go to its teacher."
    )
    cascade_budget_ms: float | None = Field(
        None, gt=0, description="As /v1/classify's: past it a student's unsure texts keep its answers."
    )


class Prediction(TypedDict):
    label: str
    score: float
    model: str  # the model that answered (a student, or its teacher for an unsure input)


class Scored(Prediction):
    raw_score: float  # the label's logit (the cascade reads the probability, `score`)


def tei_inputs(inputs: str | list[str] | list[list[str]]) -> tuple[list[TextOrPair], bool]:
    """The texts and pairs of a /predict request, and whether it was a batch. TEI reads a flat list as one
    sequence: two texts are a pair, one a text."""

    def sequence(item: list[str], where: str) -> TextOrPair:
        if len(item) not in (1, 2):
            raise InvalidInputError(
                f"{where}: {len(item)} texts; a sequence is one text or a pair of two", param="inputs"
            )
        for k, text in enumerate(item):
            if not text.strip():
                raise InvalidInputError(f"{where}[{k}]: the text is empty", param="inputs")
        return item[0] if len(item) == 1 else (item[0], item[1])

    if isinstance(inputs, str):
        if not inputs.strip():
            raise InvalidInputError("inputs: the text is empty", param="inputs")
        return [inputs], False
    if not inputs:
        raise InvalidInputError("inputs: the batch is empty", param="inputs")
    if all(isinstance(i, str) for i in inputs):
        return [sequence(inputs, "inputs")], False  # type: ignore[arg-type]
    items = []
    for i, item in enumerate(inputs):
        if not isinstance(item, list):
            raise InvalidInputError(
                f'inputs[{i}]: expected ["text"] or ["query", "document"]', param="inputs"
            )
        items.append(sequence(item, f"inputs[{i}]"))
    return items, True


async def handle_predict(
    body: PredictRequest, x: Exchange, c: Collaborators
) -> list[Prediction] | list[list[Prediction]]:
    model = c.resolve(NAME, body.model, None, x)
    items, batch = tei_inputs(body.inputs)
    c.check_batch(len(items), x)
    metrics, timeout_s = c.metrics, c.settings.request_timeout_s

    async def every_label(model: ServedModel, items: Sequence[TextOrPair], x: Exchange) -> list[list[Scored]]:
        outputs, _ = await run_texts(model, items, body.truncate, metrics, timeout_s, x)
        return [_scored(o, model) for o in outputs]

    rows = await c.pairs.answer(model, items, every_label, body.cascade_threshold, x, body.cascade_budget_ms)
    answers = [
        [
            Prediction(
                label=r["label"], score=r["raw_score"] if body.raw_scores else r["score"], model=r["model"]
            )
            for r in row
        ]
        for row in rows
    ]
    return answers if batch else answers[0]


def _scored(outputs: dict[str, np.ndarray], model: ServedModel) -> list[Scored]:
    """Every label, best first, with its probability and its logit."""
    probabilities, logits = outputs["probabilities"], outputs["logits"].tolist()
    labels = model.manifest.labels
    logit_of = {labels.get(i, f"LABEL_{i}"): float(v) for i, v in enumerate(logits)}
    return [
        Scored(label=b["label"], score=b["score"], model=b["model"], raw_score=logit_of[b["label"]])
        for b in top_labels(probabilities, labels, len(probabilities), model.name)
    ]


async def infer(job: V2Job) -> dict[str, np.ndarray]:
    texts = job.texts["TEXT"]
    body = validated(
        ClassifyRequest, {"inputs": texts, **passed(job, TASK.v2.parameters)}, {"inputs": "TEXT"}
    )
    labels = label_order(job.model)
    answer = answering(classify, len(labels), job.c.metrics, job.timeout_s)
    rows = await job.c.pairs.answer(
        job.model, texts, answer, body.cascade_threshold, job.x, body.cascade_budget_ms
    )
    scores = [{r["label"]: r["score"] for r in row} for row in rows]
    return {
        "LABEL": strings([row[0]["label"] for row in rows]),
        "SCORE": np.array([row[0]["score"] for row in rows], dtype=np.float32),
        "SCORES": np.array([[s.get(label, 0.0) for label in labels] for s in scores], dtype=np.float32),
        "MODEL": answered_by([row[0] for row in rows]),
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
        Endpoint(
            "/predict",
            PredictRequest,
            list[Prediction] | list[list[Prediction]],
            "text-embeddings-inference's /predict: every label of one text, or of each text of a batch.",
            handle_predict,
        ),
    ),
    v2=V2Interface(
        inputs=("TEXT",),
        outputs=(tensor("LABEL", "BYTES"), tensor("SCORE", "FP32"), tensor("SCORES", "FP32", 2), ANSWERED_BY),
        parameters=("cascade_threshold", "cascade_budget_ms"),
        run=infer,
    ),
    engine=EngineAsks(finish=with_probabilities),
)
