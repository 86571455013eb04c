"""`POST /tokenize`, text-embeddings-inference's: each text's tokens with their ids, their pieces of the text
and whether they are special (`add_special_tokens`, default true). TEI serves one model; here `model` names
one, and may be left out when the server serves one. Offsets count characters."""

from __future__ import annotations

from fastapi import APIRouter, Depends, Request
from pydantic import BaseModel, ConfigDict, Field

from service.api.deps import json_collaborators
from service.api.schemas import ERRORS
from service.exchange import exchange_of
from service.registry import AmbiguousModelError
from service.tasks.common import check_chars
from service.tasks.contract import Collaborators, InvalidInputError, Texts

router = APIRouter(tags=["embeddings"])


class TokenizeRequest(BaseModel):
    model_config = ConfigDict(extra="ignore", strict=True)

    inputs: Texts = Field(..., description="One text or a list of texts.", examples=["I loved this film"])
    add_special_tokens: bool = Field(True, description="The model's special tokens around the text.")
    prompt_name: str | None = Field(None, description="Not supported: must be null.")
    model: str | None = Field(None, description="Model name; may be left out when one model is served.")


class SimpleToken(BaseModel):
    id: int
    text: str
    special: bool
    start: int | None = Field(description="The token's first character in the text; null: special.")
    stop: int | None = Field(description="Past its last character; null: special.")


@router.post(
    "/tokenize",
    response_model=list[list[SimpleToken]],
    responses=ERRORS,
    summary="text-embeddings-inference's /tokenize: each text's tokens, a list per text.",
)
async def tokenize(
    request: Request, body: TokenizeRequest, c: Collaborators = Depends(json_collaborators)
) -> list[list[SimpleToken]]:
    if body.prompt_name is not None:
        raise InvalidInputError(
            "prompt_name is not supported: the models have no prompts", param="prompt_name"
        )
    x = exchange_of(request.scope)
    names = c.registry.names()
    if body.model is None and len(names) != 1:
        raise AmbiguousModelError(f"{len(names)} models are served ({', '.join(names)}): name one in `model`")
    model = c.registry.get(body.model or names[0])
    texts = c.texts(body.inputs, x)
    check_chars(texts, x)
    return [
        [SimpleToken(**vars(t)) for t in model.encoder.tokens(text, body.add_special_tokens)]
        for text in texts
    ]
