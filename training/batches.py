"""Batching that every task shares: seeded loaders, right-padding, and text packed into token blocks."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import torch
from torch.utils.data import DataLoader

from training.trainer import Batch


def make_dataloader(
    features: Sequence[Any],
    collate: Callable[[list[Any]], Batch] | None = None,
    *,
    batch_size: int,
    shuffle: bool,
    seed: int = 0,
) -> DataLoader:
    """Batches of `features` (any sequence is a map-style dataset); the shuffle order is seeded."""
    return DataLoader(
        features,  # type: ignore[arg-type]  # a list is a map-style dataset
        batch_size=batch_size,
        shuffle=shuffle,
        generator=torch.Generator().manual_seed(seed),
        collate_fn=collate,
    )


def pad(sequences: Sequence[Sequence[int]], fill: int, length: int | None = None) -> torch.Tensor:
    """Right-pad every sequence with `fill` to the longest one (or to `length`): a [N, L] long tensor."""
    width = max(len(s) for s in sequences) if length is None else length
    return torch.tensor([list(s) + [fill] * (width - len(s)) for s in sequences], dtype=torch.long)


def pack(sequences: Sequence[Sequence[int]], block_size: int, pad_id: int) -> Batch:
    """Concatenate token sequences and cut the stream into blocks of `block_size` (GPT-2/BERT pretraining).

    Every block is full, so no compute goes to padding; only the last one may be shorter, and is padded
    (attention_mask 0) rather than dropped so that evaluation covers every token.
    """
    stream = [token for sequence in sequences for token in sequence]
    if not stream:
        raise ValueError("no tokens to pack")
    blocks = [stream[i : i + block_size] for i in range(0, len(stream), block_size)]
    mask = [[1] * len(block) for block in blocks]
    return {"input_ids": pad(blocks, pad_id, block_size), "attention_mask": pad(mask, 0, block_size)}


def rows(batch: Batch) -> list[Batch]:
    """One dict per example, for a DataLoader whose default collate stacks them back into batches."""
    size = next(iter(batch.values())).size(0)
    return [{key: value[i] for key, value in batch.items()} for i in range(size)]
