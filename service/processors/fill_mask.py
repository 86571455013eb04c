"""Texts with one mask token -> the top-k tokens for it, with the completed sequences."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TypedDict

from service.metrics import Metrics
from service.processors.common import InvalidInputError, check_chars, enforce_window, run_all, tokenizing
from service.served import ServedModel
from service.tasks.fill_mask import mask_positions, top_tokens


class Candidate(TypedDict):
    token: int
    token_str: str
    score: float
    sequence: str


async def fill_mask(
    model: ServedModel, texts: Sequence[str], top_k: int, metrics: Metrics, timeout_s: float
) -> list[list[Candidate]]:
    mask_id = model.manifest.special_tokens.mask
    assert mask_id is not None  # the manifest schema requires it for fill-mask
    mask_token = model.encoder.id_to_token(mask_id) or "[MASK]"
    check_chars(texts)
    with tokenizing(metrics, model):
        encoded = model.encoder.encode(texts)
    enforce_window(encoded, model.encoder.max_length)
    for i, (text, e) in enumerate(zip(texts, encoded, strict=True)):
        found = len(mask_positions(e.input_ids, mask_id))
        where = f"input {i}" if len(texts) > 1 else "the input"
        if found == 0 and mask_token in text:
            raise InvalidInputError(
                f"{where}: {mask_token} lies past the model's {model.encoder.max_length} tokens"
            )
        if e.truncated:  # a mask cut off with the text's end still makes one too many
            found = max(found, text.count(mask_token))
        if found != 1:
            raise InvalidInputError(f"{where} has {found} {mask_token} tokens; exactly one is supported")
    outputs = await run_all(model, encoded, timeout_s)
    results = []
    for e, out in zip(encoded, outputs, strict=True):
        position = int(mask_positions(e.input_ids, mask_id)[0])
        candidates = []
        for token_id, score in top_tokens(out["logits"][0], top_k):
            ids = e.input_ids.copy()
            ids[position] = token_id
            candidates.append(
                Candidate(
                    token=token_id,
                    token_str=model.encoder.decode([token_id]),
                    score=score,
                    sequence=model.encoder.decode(ids.tolist()),
                )
            )
        results.append(candidates)
    return results
