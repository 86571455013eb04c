"""The slot cache on its own: each live row holds its sequence's positions, whatever joins, leaves, grows
or is cut back around it, and the mask shows exactly those positions (and the new one)."""

from __future__ import annotations

import numpy as np

from service.generation.slot_cache import ROOM, LayerCache, SlotCache

HEADS, DIM = 2, 3


def positions(seq: float, first: int, count: int) -> np.ndarray:
    """A made-up cache row [heads, count, dim]: position p of sequence `seq` holds seq * 1000 + p."""
    values = seq * 1000 + np.arange(first, first + count, dtype=np.float32)
    return np.broadcast_to(values[None, :, None], (HEADS, count, DIM)).astype(np.float32)


def row_cache(seq: float, length: int) -> list[LayerCache]:
    return [(positions(seq, 0, length), -positions(seq, 0, length))]


def expect(cache: SlotCache, lengths: dict[int, int]) -> None:
    """Every live row holds exactly its sequence's positions, and the mask shows them and the new one."""
    past, mask, new_positions = cache.feeds()
    assert cache.ids == list(lengths)
    for row, (seq, length) in enumerate(lengths.items()):
        keys, values = past[0][0][row], past[0][1][row]
        np.testing.assert_array_equal(keys[:, :length], positions(seq, 0, length))
        np.testing.assert_array_equal(values[:, :length], -positions(seq, 0, length))
        assert mask[row, :length].all() and not mask[row, length:-1].any() and mask[row, -1] == 1
        assert new_positions[row, 0] == length
    assert cache.longest == max(lengths.values(), default=0) < cache.columns


def test_rows_join_leave_and_grow_without_disturbing_each_other() -> None:
    cache = SlotCache(layers=1, heads=HEADS, head_dim=DIM)
    cache.join(1, row_cache(1, 3))
    cache.join(2, row_cache(2, 5))
    cache.join(3, row_cache(3, 2))
    expect(cache, {1: 3, 2: 5, 3: 2})
    cache.leave(1)  # the last row moves into the freed one
    expect(cache, {3: 2, 2: 5})

    lengths = {3: 2, 2: 5}
    for _ in range(2 * ROOM + 3):  # each step's new position after each row's last: the columns widen
        new = np.stack([positions(seq, length, 1) for seq, length in lengths.items()])
        cache.append([(new, -new)])
        lengths = {seq: length + 1 for seq, length in lengths.items()}
    expect(cache, lengths)
    cache.leave(2)
    expect(cache, {3: lengths[3]})


def test_several_positions_at_once_and_cut_back() -> None:
    """Speculative decoding feeds k + 1 positions per row at once, then cuts each row back to what the
    teacher kept."""
    cache = SlotCache(layers=1, heads=HEADS, head_dim=DIM)
    cache.join(7, row_cache(7, 4))
    cache.join(8, row_cache(8, 1))
    new = np.stack([positions(7, 4, 3), positions(8, 1, 3)])
    cache.extend([(new, -new)])
    expect(cache, {7: 7, 8: 4})
    cache.truncate(np.array([5, 2]))
    expect(cache, {7: 5, 8: 2})
    new = np.stack([positions(7, 5, 1), positions(8, 2, 1)])
    cache.append([(new, -new)])  # written right after the kept positions, over the refused ones
    expect(cache, {7: 6, 8: 3})
