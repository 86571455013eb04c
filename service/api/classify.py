"""`POST /v1/classify`: texts -> top-k labels per text, in the HF pipeline's shape."""

from __future__ import annotations

from fastapi import APIRouter, Depends, Request

from service.api.deps import Collaborators, json_collaborators, label_request
from service.api.schemas import ERRORS, ClassifyRequest, LabelScore
from service.api.task_route import TaskRoute
from service.processors.classification import classify as run_classify

router = APIRouter(tags=["tasks"], route_class=TaskRoute)


@router.post(
    "/v1/classify",
    response_model=list[LabelScore] | list[list[LabelScore]],
    responses=ERRORS,
    summary="Classify one text (-> a list of {label, score}) or a list of texts (-> a list per text).",
)
async def classify(
    body: ClassifyRequest, request: Request, c: Collaborators = Depends(json_collaborators)
) -> list[LabelScore] | list[list[LabelScore]]:
    model = c.registry.resolve("text-classification", body.model, body.version)
    label_request(request, model)
    texts = c.texts(body.inputs)
    results = await run_classify(model, texts, body.top_k, c.metrics, c.settings.request_timeout_s)
    rows = [[LabelScore(**r) for r in row] for row in results]
    return rows[0] if isinstance(body.inputs, str) else rows
