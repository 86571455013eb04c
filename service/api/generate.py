"""`POST /v1/generate`: prompt -> continuation."""

from __future__ import annotations

from fastapi import APIRouter, Depends, Request

from service.api.deps import Collaborators, collaborators, label_request, require_json
from service.api.schemas import ERRORS, GenerateRequest, GenerateResponse
from service.processors.generation import generate as run_generate

router = APIRouter(tags=["tasks"], dependencies=[Depends(require_json)])


@router.post("/v1/generate", response_model=GenerateResponse, responses=ERRORS, summary="Continue a prompt.")
async def generate(
    body: GenerateRequest, request: Request, c: Collaborators = Depends(collaborators)
) -> GenerateResponse:
    model = c.registry.resolve("text-generation", body.model, body.version)
    label_request(request, model)
    result = await run_generate(
        model, body.prompt, body.max_new_tokens, c.metrics, c.settings.request_timeout_s
    )
    return GenerateResponse(**result)
