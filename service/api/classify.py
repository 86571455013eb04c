"""`POST /v1/classify`: texts -> top-k labels per text, in the HF pipeline's shape."""

from __future__ import annotations

import asyncio
import time

from fastapi import APIRouter, Depends, Request

from service.api.deps import get_metrics, get_registry, get_settings, label_request, require_json
from service.api.errors import InvalidInputError
from service.api.schemas import ClassifyRequest, ErrorBody, LabelScore
from service.metrics import Metrics
from service.registry import ModelRegistry
from service.settings import Settings
from service.tasks.classification import top_labels

router = APIRouter(tags=["tasks"], dependencies=[Depends(require_json)])

ERRORS: dict[int | str, dict[str, object]] = {
    code: {"model": ErrorBody} for code in (404, 415, 422, 429, 500, 503, 504)
}


@router.post(
    "/v1/classify",
    response_model=list[LabelScore] | list[list[LabelScore]],
    responses=ERRORS,
    summary="Classify one text (-> a list of {label, score}) or a list of texts (-> a list per text).",
)
async def classify(
    body: ClassifyRequest,
    request: Request,
    registry: ModelRegistry = Depends(get_registry),
    settings: Settings = Depends(get_settings),
    metrics: Metrics = Depends(get_metrics),
) -> list[LabelScore] | list[list[LabelScore]]:
    model = registry.resolve("text-classification", body.model, body.version)
    label_request(request, model)
    texts = [body.inputs] if isinstance(body.inputs, str) else body.inputs
    if not texts:
        raise InvalidInputError("inputs: give at least one text")
    if len(texts) > settings.max_client_batch:
        raise InvalidInputError(
            f"inputs: {len(texts)} texts, at most {settings.max_client_batch} per request"
        )

    started = time.perf_counter()
    encoded = model.encoder.encode(texts)
    metrics.tokenize_duration.labels(model.name).observe(time.perf_counter() - started)

    outputs = await asyncio.gather(
        *(model.batcher.submit(e, timeout_s=settings.request_timeout_s) for e in encoded)
    )
    labels = model.manifest.labels
    results = [[LabelScore(**s) for s in top_labels(o["logits"], labels, body.top_k)] for o in outputs]
    return results[0] if isinstance(body.inputs, str) else results
