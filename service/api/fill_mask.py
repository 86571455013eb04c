"""`POST /v1/fill-mask`: a text with one mask token -> the top-k tokens for it."""

from __future__ import annotations

from fastapi import APIRouter, Depends, Request

from service.api.deps import Collaborators, json_collaborators, label_request
from service.api.schemas import ERRORS, FillMaskCandidate, FillMaskRequest
from service.api.task_route import TaskRoute
from service.processors.fill_mask import fill_mask as run_fill_mask

router = APIRouter(tags=["tasks"], route_class=TaskRoute)


@router.post(
    "/v1/fill-mask",
    response_model=list[FillMaskCandidate] | list[list[FillMaskCandidate]],
    responses=ERRORS,
    summary="Fill the mask: one text -> a list of candidates; a list of texts -> a list per text.",
)
async def fill_mask(
    body: FillMaskRequest, request: Request, c: Collaborators = Depends(json_collaborators)
) -> list[FillMaskCandidate] | list[list[FillMaskCandidate]]:
    model = c.registry.resolve("fill-mask", body.model, body.version)
    label_request(request, model)
    texts = c.texts(body.inputs)
    results = await run_fill_mask(model, texts, body.top_k, c.metrics, c.settings.request_timeout_s)
    rows = [[FillMaskCandidate(**r) for r in row] for row in results]
    return rows[0] if isinstance(body.inputs, str) else rows
