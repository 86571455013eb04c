"""`GET /v1/models`: what is served, where it runs, and where it came from."""

from __future__ import annotations

from fastapi import APIRouter, Depends

from service.api.deps import get_registry
from service.api.schemas import ModelCard, ModelList
from service.registry import ModelRegistry

router = APIRouter(tags=["models"])


@router.get("/v1/models", response_model=ModelList)
async def list_models(registry: ModelRegistry = Depends(get_registry)) -> ModelList:
    return ModelList(models=[ModelCard.model_validate(m.describe()) for m in registry.all()])
