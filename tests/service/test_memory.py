"""Freed heap memory handed back: the resident set falls by what was freed inside the heap."""

from __future__ import annotations

import pytest

from service.memory import _malloc_trim, give_back_freed_memory, resident_bytes

MIB = 1 << 20


@pytest.mark.skipif(_malloc_trim() is None or resident_bytes() is None, reason="glibc and /proc only")
def test_memory_freed_inside_the_heap_goes_back_to_the_system() -> None:
    """256 MiB in 64 KiB blocks (under glibc's mmap threshold: heap, not mappings of their own), all freed
    but the last, which pins the heap's top so free() alone cannot shrink it: a dropped session's shape."""
    give_back_freed_memory("before")
    baseline = resident_bytes()
    assert baseline is not None
    blocks = [bytearray(64 * 1024) for _ in range(4096)]  # bytearray writes its zeros: pages resident
    last = blocks.pop()
    del blocks
    held = resident_bytes()
    assert held is not None and held - baseline > 200 * MIB  # freed, yet still resident
    returned = give_back_freed_memory("test")
    assert returned is not None and returned > 200 * MIB
    after = resident_bytes()
    assert after is not None and after - baseline < 32 * MIB
    assert len(last) == 64 * 1024
