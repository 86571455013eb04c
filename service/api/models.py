"""`GET /v1/models`: what is served, where it runs, and where it came from."""

from __future__ import annotations

from fastapi import APIRouter, Depends

from service.api.deps import Collaborators, collaborators
from service.api.schemas import ModelCard, ModelList

router = APIRouter(tags=["models"])


@router.get("/v1/models", response_model=ModelList)
async def list_models(c: Collaborators = Depends(collaborators)) -> ModelList:
    workers = c.settings.workers
    return ModelList(
        models=[ModelCard.model_validate(m.describe() | {"workers": workers}) for m in c.registry.all()]
    )
