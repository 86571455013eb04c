"""Prompt -> tokens from the generation engine, whole or as a stream of events."""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import TypedDict

from service.generation.engine import GenerationEngine
from service.generation.sampling import SamplingParams
from service.generation.sequence import Sequence, TokenEvent
from service.metrics import Metrics
from service.processors.common import InvalidInputError, check_chars, tokenizing
from service.runtime import ServedModel


class Completion(TypedDict):
    generated_text: str
    tokens: int
    prompt_tokens: int
    finish_reason: str


@dataclass(frozen=True)
class Prepared:
    engine: GenerationEngine
    prompt: list[int]
    params: SamplingParams


def prepare(
    model: ServedModel, prompt: str, params: SamplingParams, truncate_prompt: bool, metrics: Metrics
) -> Prepared:
    """Tokenize; keep the prompt inside the window (422, or its last tokens when asked); cap the output."""
    if model.generator is None:
        raise InvalidInputError(f"model {model.name!r} serves {model.manifest.task}, not text-generation")
    check_chars([prompt], "prompt")
    with tokenizing(metrics, model):
        ids = [int(t) for t in model.encoder.encode_untruncated(prompt).input_ids]
    if not ids:
        raise InvalidInputError("the prompt encodes to no tokens")
    window = model.manifest.max_sequence_length
    if len(ids) >= window:
        if not truncate_prompt:
            raise InvalidInputError(
                f"the prompt is {len(ids)} tokens; the model's window is {window} tokens "
                "(shorten it, or set truncate_prompt to keep its end)"
            )
        ids = ids[-(window - 1) :]
    room = window - len(ids)
    if params.max_new_tokens > room:
        params = SamplingParams(**{**params.__dict__, "max_new_tokens": room})
    return Prepared(model.generator, ids, params)


async def complete(prepared: Prepared) -> Completion:
    seq, text = await prepared.engine.generate(prepared.prompt, prepared.params)
    return Completion(
        generated_text=text,
        tokens=seq.streamed,
        prompt_tokens=len(seq.prompt),
        finish_reason=seq.finish_reason or "length",
    )


def start_stream(prepared: Prepared) -> tuple[Sequence, AsyncIterator[list[TokenEvent]]]:
    """Queue the request now (so 429 comes before any byte is sent) and return its events, in the groups
    the engine's stream interval hands them out in (one write each)."""
    seq = prepared.engine.submit(prepared.prompt, prepared.params)
    return seq, prepared.engine.stream_groups(seq)
