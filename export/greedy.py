"""Greedy decoding on the exported decoder (numpy + ONNX Runtime), checked against PyTorch `generate()`.

Deliberately the simplest loop that uses the KV cache: one sequence, prefill then one token per step.
The service's generation engine (continuous batching) is a separate, larger piece.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import onnxruntime as ort

from common.logit_positions import LOGIT_POSITIONS, last_position
from service.manifest import GenerationLayout


def greedy_onnx(
    session: ort.InferenceSession, layout: GenerationLayout, prompt: Sequence[int], max_new_tokens: int
) -> list[int]:
    """New token ids (ending with eos if produced) for one prompt."""
    names = [o.name for o in session.get_outputs()]
    wanted = {i.name for i in session.get_inputs()}
    empty = np.zeros((1, layout.num_key_value_heads, 0, layout.head_dim), dtype=np.float32)
    past = {layout.past_key_name.format(layer=i): empty for i in range(layout.num_layers)}
    past |= {layout.past_value_name.format(layer=i): empty for i in range(layout.num_layers)}
    ids = np.asarray([list(prompt)], dtype=np.int64)
    total = ids.shape[1]
    positions = np.arange(total, dtype=np.int64)[None, :]
    new: list[int] = []
    for _ in range(max_new_tokens):
        feeds = {
            "input_ids": ids,
            "attention_mask": np.ones((1, total), dtype=np.int64),
            "position_ids": positions,
            LOGIT_POSITIONS: last_position(1, ids.shape[1]),  # the one a token is chosen from
        }
        outputs = dict(
            zip(
                names,
                session.run(names, {k: v for k, v in (feeds | past).items() if k in wanted}),
                strict=True,
            )
        )
        token = int(outputs["logits"][0, -1].argmax())
        new.append(token)
        if token in layout.stop_ids():
            break
        presents = {
            layout.past_key_name.format(layer=i): outputs[layout.present_key_name.format(layer=i)]
            for i in range(layout.num_layers)
        } | {
            layout.past_value_name.format(layer=i): outputs[layout.present_value_name.format(layer=i)]
            for i in range(layout.num_layers)
        }
        if layout.present_positions == "new":  # the graph returned only this call's positions
            presents = {name: np.concatenate([past[name], new], axis=2) for name, new in presents.items()}
        past = presents
        ids = np.asarray([[token]], dtype=np.int64)
        positions = np.asarray([[total]], dtype=np.int64)
        total += 1
    return new


def greedy_torch(
    model: Any, prompt: Sequence[int], max_new_tokens: int, eos_token_id: int | list[int] | None
) -> list[int]:
    import torch

    input_ids = torch.tensor([list(prompt)])
    with torch.no_grad():
        out = model.generate(
            input_ids,
            attention_mask=torch.ones_like(input_ids),
            max_new_tokens=max_new_tokens,
            min_new_tokens=0,
            do_sample=False,
            num_beams=1,
            eos_token_id=eos_token_id,
            pad_token_id=eos_token_id[0] if isinstance(eos_token_id, list) else eos_token_id,
        )
    return [int(t) for t in out[0, input_ids.shape[1] :]]


def greedy_match(
    session: ort.InferenceSession,
    layout: GenerationLayout,
    model: Any,
    prompts: Sequence[Sequence[int]],
    max_new_tokens: int,
) -> float:
    """Share of prompts whose ONNX greedy continuation equals PyTorch's token for token."""
    same = sum(
        greedy_onnx(session, layout, p, max_new_tokens)
        == greedy_torch(model, p, max_new_tokens, sorted(layout.stop_ids()) or None)
        for p in prompts
    )
    return same / max(len(prompts), 1)
