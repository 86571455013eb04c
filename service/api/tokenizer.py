"""The tokenizer's routes, in the two shapes clients already speak.

- text-embeddings-inference: `POST /tokenize` with `inputs` (one text or a list): each text's tokens with
  their ids, their pieces of the text (character offsets) and whether they are special.
- vLLM: `POST /tokenize` with `prompt` -> `{"count", "max_model_len", "tokens"}`, `POST /detokenize` with
  `tokens` -> `{"prompt"}`, and `GET /tokenizer_info` (the special tokens, the chat template, the window).
  lm-evaluation-harness's `local-completions` finds a server's tokenizer through these (its "remote"
  tokenizer) and then sends token-id prompts, which /v1/completions takes.

One path serves both /tokenize bodies: `inputs` makes it TEI's, otherwise vLLM's. `model` names the model;
left out, the server's only model answers, or, where several are served, the one tokenizer they all share
(a teacher and its students do), as vLLM's single-model routes need.
"""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, Depends, Query, Request
from pydantic import BaseModel, ConfigDict, Discriminator, Field, Tag

from service.api.deps import collaborators, json_collaborators
from service.api.schemas import ERRORS
from service.exchange import exchange_of
from service.registry import AmbiguousModelError
from service.served import ServedModel
from service.tasks.common import check_chars
from service.tasks.contract import Collaborators, InvalidInputError, Texts

router = APIRouter(tags=["tokenizer"])


def tokenizer_model(c: Collaborators, name: str | None) -> ServedModel:
    """The model named; unnamed, the only one served, or any of several that share one tokenizer."""
    if name is not None:
        return c.registry.get(name)
    names = c.registry.names()
    served = [c.registry.get(n) for n in names]
    if served and len({m.manifest.tokenizer.sha256 for m in served}) == 1:
        return served[0]
    raise AmbiguousModelError(
        f"{len(names)} models with different tokenizers are served ({', '.join(names)}): name one in `model`"
    )


# -- /tokenize --------------------------------------------------------------------------------------------


class TeiTokenizeRequest(BaseModel):
    model_config = ConfigDict(extra="ignore", strict=True)

    inputs: Texts = Field(..., description="One text or a list of texts.", examples=["I loved this film"])
    add_special_tokens: bool = Field(True, description="The model's special tokens around the text.")
    prompt_name: str | None = Field(None, description="Not supported: must be null.")
    model: str | None = Field(None, description="Model name; may be left out (see the module).")


class PromptTokenizeRequest(BaseModel):
    model_config = ConfigDict(extra="ignore", strict=True)

    prompt: str = Field(..., description="The text.", examples=["The capital of France is"])
    add_special_tokens: bool = Field(True, description="The model's special tokens around the text.")
    model: str | None = Field(None, description="Model name; may be left out (see the module).")


def _tokenize_shape(body: Any) -> str:
    return "tei" if isinstance(body, dict) and "inputs" in body else "vllm"


TokenizeBody = Annotated[
    Annotated[TeiTokenizeRequest, Tag("tei")] | Annotated[PromptTokenizeRequest, Tag("vllm")],
    Discriminator(_tokenize_shape),
]


class SimpleToken(BaseModel):
    id: int
    text: str
    special: bool
    start: int | None = Field(description="The token's first character in the text; null: special.")
    stop: int | None = Field(description="Past its last character; null: special.")


class PromptTokens(BaseModel):
    count: int
    max_model_len: int = Field(description="The model's window, in tokens.")
    tokens: list[int]


@router.post(
    "/tokenize",
    response_model=list[list[SimpleToken]] | PromptTokens,
    responses=ERRORS,
    summary="A text's tokens: TEI's shape (`inputs`: a list of tokens per text) or vLLM's (`prompt`: ids).",
)
async def tokenize(
    request: Request, body: TokenizeBody, c: Collaborators = Depends(json_collaborators)
) -> list[list[SimpleToken]] | PromptTokens:
    x = exchange_of(request.scope)
    model = tokenizer_model(c, body.model)
    if isinstance(body, PromptTokenizeRequest):
        check_chars([body.prompt], x, "prompt")
        ids = [
            int(i) for i in model.encoder.encode_untruncated(body.prompt, body.add_special_tokens).input_ids
        ]
        return PromptTokens(count=len(ids), max_model_len=model.manifest.max_sequence_length, tokens=ids)
    if body.prompt_name is not None:
        raise InvalidInputError(
            "prompt_name is not supported: the models have no prompts", param="prompt_name"
        )
    texts = c.texts(body.inputs, x)
    check_chars(texts, x)
    return [
        [SimpleToken(**vars(t)) for t in model.encoder.tokens(text, body.add_special_tokens)]
        for text in texts
    ]


# -- /detokenize and /tokenizer_info (vLLM) ---------------------------------------------------------------


class DetokenizeRequest(BaseModel):
    model_config = ConfigDict(extra="ignore", strict=True)

    tokens: list[Annotated[int, Field(ge=0)]] = Field(..., description="Token ids.", examples=[[504, 3575]])
    model: str | None = Field(None, description="Model name; may be left out (see the module).")


class Detokenized(BaseModel):
    prompt: str


@router.post(
    "/detokenize",
    response_model=Detokenized,
    responses=ERRORS,
    summary="vLLM's /detokenize: the text token ids spell (special tokens included).",
)
async def detokenize(body: DetokenizeRequest, c: Collaborators = Depends(json_collaborators)) -> Detokenized:
    model = tokenizer_model(c, body.model)
    vocab = model.encoder.vocab_size
    if any(t >= vocab for t in body.tokens):
        raise InvalidInputError(f"token ids must be below the vocabulary's {vocab}", param="tokens")
    return Detokenized(prompt=model.encoder.decode(body.tokens, skip_special_tokens=False))


class TokenizerInfo(BaseModel):
    model_config = ConfigDict(extra="allow")

    tokenizer_class: str = Field(description="`PreTrainedTokenizerFast`: a tokenizers JSON file.")
    model_max_length: int = Field(description="The model's window, in tokens.")
    vocab_size: int
    bos_token: str | None
    eos_token: str | None
    pad_token: str | None
    unk_token: str | None
    chat_template: str | None


@router.get(
    "/tokenizer_info",
    response_model=TokenizerInfo,
    responses=ERRORS,
    summary="vLLM's /tokenizer_info: the special tokens, the chat template and the window.",
)
async def tokenizer_info(
    model: str | None = Query(None, description="Model name; may be left out (see the module)."),
    c: Collaborators = Depends(collaborators),
) -> TokenizerInfo:
    served = tokenizer_model(c, model)
    m, encoder = served.manifest, served.encoder
    special = m.special_tokens

    def text(token_id: int | None) -> str | None:
        return encoder.id_to_token(token_id) if token_id is not None else None

    eos = m.chat.eos_token if m.chat is not None and m.chat.eos_token else text(special.eos)
    bos = m.chat.bos_token if m.chat is not None and m.chat.bos_token else text(special.bos)
    return TokenizerInfo(
        tokenizer_class="PreTrainedTokenizerFast",
        model_max_length=m.max_sequence_length,
        vocab_size=encoder.vocab_size,
        bos_token=bos,
        eos_token=eos,
        pad_token=text(special.pad),
        unk_token=text(special.unk),
        chat_template=m.chat.template if m.chat is not None else None,
    )
