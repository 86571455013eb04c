"""Prompt -> continuation (greedy; the generation engine adds sampling, batching and streaming)."""

from __future__ import annotations

from typing import TypedDict

from service.metrics import Metrics
from service.processors.common import InvalidInputError, tokenizing
from service.runtime import GenerationJob, ServedModel


class Completion(TypedDict):
    generated_text: str
    tokens: int
    finish_reason: str


async def generate(
    model: ServedModel, prompt: str, max_new_tokens: int, metrics: Metrics, timeout_s: float
) -> Completion:
    with tokenizing(metrics, model):
        [encoded] = model.encoder.encode([prompt])
    window = model.manifest.max_sequence_length
    if encoded.truncated or len(encoded) >= window:
        raise InvalidInputError(
            f"the prompt needs more than the model's window of {window} tokens; shorten it"
        )
    if len(encoded) == 0:
        raise InvalidInputError("the prompt encodes to no tokens")
    job = GenerationJob(prompt=tuple(int(t) for t in encoded.input_ids), max_new_tokens=max_new_tokens)
    result = await model.batcher.submit(job, timeout_s=timeout_s)
    eos = model.manifest.generation.eos_token_id if model.manifest.generation else None
    text_ids = [t for t in result.token_ids if t != eos]
    return Completion(
        generated_text=model.encoder.decode(text_ids),
        tokens=len(result.token_ids),
        finish_reason=result.finish_reason,
    )
