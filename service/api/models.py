"""`GET /v1/models`: what is served, where it runs, and where it came from."""

from __future__ import annotations

from datetime import datetime

from fastapi import APIRouter, Depends

from service.api.deps import collaborators
from service.api.schemas import OPENAI_ERRORS, ModelCard, ModelList, OpenAIModel
from service.served import ServedModel
from service.settings import frontend_count
from service.tasks.contract import Collaborators
from service.tasks.retrieval import documents_model

router = APIRouter(tags=["models"])


@router.get("/v1/models", response_model=ModelList)
async def list_models(c: Collaborators = Depends(collaborators)) -> ModelList:
    frontends = frontend_count(c.settings)
    return ModelList(
        models=[
            ModelCard.model_validate(
                m.describe() | c.pairs.describe(m) | {"frontends": frontends, "documents_by": _by(m, c)}
            )
            for m in c.registry.all()
        ],
        data=[_openai(c.registry.get(name)) for name in c.registry.names()],
    )


def _by(model: ServedModel, c: Collaborators) -> str | None:
    """Who embeds the documents an embedding model ranks (None: another task)."""
    return documents_model(model, c).name if model.manifest.embedding is not None else None


def _openai(model: ServedModel) -> OpenAIModel:
    created = model.manifest.created_at
    try:
        timestamp = int(datetime.fromisoformat(created).timestamp()) if created else 0
    except ValueError:
        timestamp = 0
    return OpenAIModel(id=model.name, created=timestamp, chat=model.can_chat)


@router.get(
    "/v1/models/{name}",
    response_model=OpenAIModel,
    responses={404: OPENAI_ERRORS[404]},
    summary="One model, in OpenAI's format.",
)
async def retrieve_model(name: str, c: Collaborators = Depends(collaborators)) -> OpenAIModel:
    return _openai(c.registry.get(name))
