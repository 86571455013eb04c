"""One sequence at a time, greedy, with the KV cache: prefill the prompt, then one token per step.

The simple path the generate endpoint starts with; continuous batching (sequences joining and leaving a
running batch between steps) replaces it as the generation engine.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

import numpy as np

from service.engine import Engine
from service.manifest import GenerationLayout

FinishReason = Literal["length", "eos", "stop"]


@dataclass(frozen=True)
class Generation:
    token_ids: list[int]
    finish_reason: FinishReason


class GreedyDecoder:
    def __init__(self, engine: Engine, layout: GenerationLayout, max_positions: int) -> None:
        self.engine = engine
        self.layout = layout
        self.max_positions = max_positions

    def _empty_past(self) -> dict[str, np.ndarray]:
        empty = np.zeros((1, self.layout.num_heads, 0, self.layout.head_dim), dtype=np.float32)
        names = [self.layout.past_key_name, self.layout.past_value_name]
        return {name.format(layer=i): empty for i in range(self.layout.num_layers) for name in names}

    def _presents_as_past(self, outputs: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        layout = self.layout
        past = {}
        for i in range(layout.num_layers):
            past[layout.past_key_name.format(layer=i)] = outputs[layout.present_key_name.format(layer=i)]
            past[layout.past_value_name.format(layer=i)] = outputs[layout.present_value_name.format(layer=i)]
        return past

    def generate(self, prompt: Sequence[int], max_new_tokens: int) -> Generation:
        """Greedy continuation; stops at eos, at max_new_tokens, or at the model's last position."""
        ids = np.asarray([list(prompt)], dtype=np.int64)
        total = ids.shape[1]
        positions = np.arange(total, dtype=np.int64)[None, :]
        past = self._empty_past()
        new: list[int] = []
        while len(new) < max_new_tokens:
            if total > self.max_positions:
                return Generation(new, "length")
            feeds = {
                "input_ids": ids,
                "attention_mask": np.ones((1, total), dtype=np.int64),
                "position_ids": positions,
                **past,
            }
            outputs = self.engine.run(feeds)
            token = int(outputs["logits"][0, -1].argmax())
            new.append(token)
            if token == self.layout.eos_token_id:
                return Generation(new, "eos")
            past = self._presents_as_past(outputs)
            ids = np.asarray([[token]], dtype=np.int64)
            positions = np.asarray([[total]], dtype=np.int64)
            total += 1
        return Generation(new, "length")
