"""Keys and values of prompts' first tokens, kept between requests (vLLM's automatic prefix caching, TGI's
prefix cache): a prompt that begins as an earlier one did (a chat template's system turn, a few-shot
preamble, a document asked several questions) is prefilled from where the shared part ends.

A prompt is cut into blocks of `block` tokens; a block is keyed by a digest of every token up to its end,
so it is found only behind the same blocks before it. A hit leaves at least a prompt's last token to run
(its logits give the first token). Blocks are kept least recently used first out, within a byte budget,
each as one array [layers, 2 (keys, values), kv heads, block, head dim]. Keys are cached rotated (as the
graphs return them), at the positions they were computed at: a prefix is reused only at the start of a
prompt, where its positions are the same.
"""

from __future__ import annotations

import hashlib
from collections import OrderedDict
from collections.abc import Iterator, Sequence
from dataclasses import dataclass

import numpy as np

from service.generation.slot_cache import LayerCache

BLOCK_TOKENS = 16  # vLLM's default block: short shared preambles still fill a few


@dataclass(frozen=True)
class PrefixHit:
    """A prompt's first `tokens` positions, found cached: each layer's keys and values [kv heads, tokens,
    head dim]."""

    tokens: int
    layers: list[LayerCache]


class PrefixCache:
    def __init__(self, budget_bytes: int, block: int = BLOCK_TOKENS) -> None:
        self.budget_bytes = budget_bytes
        self.block = block
        self.bytes = 0
        self._blocks: OrderedDict[bytes, np.ndarray] = OrderedDict()

    def __len__(self) -> int:
        return len(self._blocks)

    def _keys(self, tokens: Sequence[int], blocks: int) -> Iterator[bytes]:
        """The digests of the first `blocks` blocks of `tokens`, each over every token up to its end."""
        digest = b""
        ids = np.asarray(tokens[: blocks * self.block], dtype=np.int64)
        for i in range(blocks):
            chunk = ids[i * self.block : (i + 1) * self.block].tobytes()
            digest = hashlib.blake2b(digest + chunk, digest_size=16).digest()
            yield digest

    def longest(self, prompt: Sequence[int]) -> PrefixHit | None:
        """The longest run of cached blocks `prompt` begins with, short of its last token; None: none."""
        found = []
        for key in self._keys(prompt, (len(prompt) - 1) // self.block):
            block = self._blocks.get(key)
            if block is None:
                break
            self._blocks.move_to_end(key)
            found.append(block)
        if not found:
            return None
        joined = np.concatenate(found, axis=3)  # [layers, 2, kv heads, tokens, head dim]
        return PrefixHit(joined.shape[3], [(layer[0], layer[1]) for layer in joined])

    def cached_length(self, prompt: Sequence[int]) -> int:
        """The tokens `longest` would find cached (a scheduler's estimate: nothing is read or refreshed)."""
        found = 0
        for key in self._keys(prompt, (len(prompt) - 1) // self.block):
            if key not in self._blocks:
                break
            found += self.block
        return found

    def add(self, prompt: Sequence[int], layers: Sequence[LayerCache]) -> None:
        """The whole blocks of `prompt` not cached yet, from its keys and values (each layer's [kv heads,
        at least len(prompt), head dim]); the least recently used blocks go past the budget."""
        keys = list(self._keys(prompt, len(prompt) // self.block))
        new = [i for i, key in enumerate(keys) if key not in self._blocks]
        for key in keys:
            if key in self._blocks:
                self._blocks.move_to_end(key)
        if not new:
            return
        first, end = new[0] * self.block, (new[-1] + 1) * self.block
        stacked = np.stack([np.stack([k[:, first:end], v[:, first:end]]) for k, v in layers])
        for i in new:
            start = i * self.block - first
            block = stacked[:, :, :, start : start + self.block].copy()  # its own memory: evictable alone
            if block.nbytes > self.budget_bytes:
                return
            self._blocks[keys[i]] = block
            self.bytes += block.nbytes
        while self.bytes > self.budget_bytes:
            _, evicted = self._blocks.popitem(last=False)
            self.bytes -= evicted.nbytes
