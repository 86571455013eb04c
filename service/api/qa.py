"""`POST /v1/qa`: question + context -> the answer span(s), as characters of the context."""

from __future__ import annotations

from fastapi import APIRouter, Depends, Request

from service.api.deps import Collaborators, json_collaborators, label_request
from service.api.schemas import ERRORS, QAAnswer, QARequest
from service.api.task_route import TaskRoute
from service.processors.qa import SpanRules, answer_all

router = APIRouter(tags=["tasks"], route_class=TaskRoute)


@router.post(
    "/v1/qa",
    response_model=QAAnswer | list[QAAnswer] | list[list[QAAnswer]],
    responses=ERRORS,
    summary="Extract answers: one pair -> an answer (a list with top_k > 1); `inputs` -> one per pair.",
)
async def qa(
    body: QARequest, request: Request, c: Collaborators = Depends(json_collaborators)
) -> QAAnswer | list[QAAnswer] | list[list[QAAnswer]]:
    model = c.registry.resolve("question-answering", body.model, body.version)
    label_request(request, model)
    pairs = body.pairs()
    c.check_batch(len(pairs))
    rules = SpanRules(body.top_k, body.max_answer_length, body.handle_impossible_answer, body.doc_stride)
    results = await answer_all(model, pairs, rules, c.metrics, c.settings.request_timeout_s)
    shaped = [[QAAnswer(**a) for a in r] for r in results]
    if body.top_k == 1:
        flat = [r[0] if r else QAAnswer(answer="", score=0.0, start=0, end=0) for r in shaped]
        return flat[0] if body.inputs is None else flat
    return shaped[0] if body.inputs is None else shaped
