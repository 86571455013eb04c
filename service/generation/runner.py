"""The runner executes a step plan on the exported decoder: batched prefill, batched decode, sampling.

Sequences of different lengths share one engine call: prompts are right-padded, cached keys/values are
gathered into a right-padded past, and the attention mask hides every padded position while each sequence
keeps its own position ids, so a sequence computes the same logits alone or in company.
"""

from __future__ import annotations

import time
from collections.abc import Sequence as Seq
from dataclasses import dataclass

import numpy as np

from service.engine import Engine
from service.generation.sampling import next_token
from service.generation.scheduler import StepPlan
from service.generation.sequence import KVCache, Sequence
from service.manifest import GenerationLayout


@dataclass(frozen=True)
class StepResult:
    tokens: dict[int, int]  # sequence id -> next token
    prefill_s: float
    decode_s: float


class DecoderRunner:
    def __init__(self, engine: Engine, layout: GenerationLayout) -> None:
        self.engine = engine
        self.layout = layout
        self._past_names = [
            (layout.past_key_name.format(layer=i), layout.past_value_name.format(layer=i))
            for i in range(layout.num_layers)
        ]
        self._present_names = [
            (layout.present_key_name.format(layer=i), layout.present_value_name.format(layer=i))
            for i in range(layout.num_layers)
        ]

    def execute(self, plan: StepPlan) -> StepResult:
        tokens: dict[int, int] = {}
        started = time.perf_counter()
        if plan.prefill:
            tokens |= self._prefill(plan.prefill)
        prefilled = time.perf_counter()
        if plan.decode:
            tokens |= self._decode(plan.decode)
        return StepResult(tokens, prefilled - started, time.perf_counter() - prefilled)

    def _run(self, input_ids: np.ndarray, mask: np.ndarray, positions: np.ndarray, past: list[tuple]) -> dict:
        feeds = {"input_ids": input_ids, "attention_mask": mask, "position_ids": positions}
        for (key_name, value_name), (keys, values) in zip(self._past_names, past, strict=True):
            feeds[key_name], feeds[value_name] = keys, values
        return self.engine.run(feeds)

    def _prefill(self, seqs: Seq[Sequence]) -> dict[int, int]:
        """All new prompts in one call: right-padded, with an empty past."""
        layout = self.layout
        width = max(len(s.prompt) for s in seqs)
        ids = np.zeros((len(seqs), width), dtype=np.int64)
        mask = np.zeros((len(seqs), width), dtype=np.int64)
        for row, s in enumerate(seqs):
            ids[row, : len(s.prompt)] = s.prompt
            mask[row, : len(s.prompt)] = 1
        positions = np.clip(np.cumsum(mask, axis=1) - 1, 0, None)
        empty = np.zeros((len(seqs), layout.num_heads, 0, layout.head_dim), dtype=np.float32)
        outputs = self._run(ids, mask, positions, [(empty, empty)] * layout.num_layers)
        tokens = {}
        for row, s in enumerate(seqs):
            n = len(s.prompt)
            s.cache = KVCache(layout.num_layers, layout.num_heads, layout.head_dim, s.capacity)
            for layer, (key_name, value_name) in enumerate(self._present_names):
                s.cache.write(layer, outputs[key_name][row, :, :n], outputs[value_name][row, :, :n], at=0)
            s.cache.length = n
            tokens[s.id] = next_token(outputs["logits"][row, n - 1], s.params, s.prompt, s.rng)
        return tokens

    def _decode(self, seqs: Seq[Sequence]) -> dict[int, int]:
        """One token for each running sequence: its last token in, its cache gathered into a padded past."""
        layout = self.layout
        batch = len(seqs)
        past_len = max(s.cache.length for s in seqs if s.cache is not None)
        mask = np.zeros((batch, past_len + 1), dtype=np.int64)
        mask[:, past_len] = 1
        ids = np.zeros((batch, 1), dtype=np.int64)
        positions = np.zeros((batch, 1), dtype=np.int64)
        past = []
        shape = (batch, layout.num_heads, past_len, layout.head_dim)
        for _ in range(layout.num_layers):
            past.append((np.zeros(shape, dtype=np.float32), np.zeros(shape, dtype=np.float32)))
        for row, s in enumerate(seqs):
            cache = _cache(s)
            n = cache.length
            mask[row, :n] = 1
            ids[row, 0] = s.output[-1]
            positions[row, 0] = n
            for layer, (keys, values) in enumerate(past):
                keys[row, :, :n] = cache.keys[layer, :, :n]
                values[row, :, :n] = cache.values[layer, :, :n]
        outputs = self._run(ids, mask, positions, past)
        tokens = {}
        for row, s in enumerate(seqs):
            cache = _cache(s)
            for layer, (key_name, value_name) in enumerate(self._present_names):
                new_keys = outputs[key_name][row, :, past_len : past_len + 1]
                new_values = outputs[value_name][row, :, past_len : past_len + 1]
                cache.write(layer, new_keys, new_values, at=cache.length)
            cache.length += 1
            tokens[s.id] = next_token(outputs["logits"][row, -1], s.params, s.prompt + s.output, s.rng)
        return tokens


def _cache(seq: Sequence) -> KVCache:
    if seq.cache is None:
        raise RuntimeError(f"sequence {seq.id} is decoding without a prefilled cache")
    return seq.cache
