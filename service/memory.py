"""Memory the engine core freed handed back to the system.

Loading a model frees as much as it keeps: ONNX Runtime parses the graph and transforms its initializers
before it settles, and a decoder's thread timing (service.runtime) builds a second session and drops the
slower one. glibc's malloc keeps such freed chunks inside its heap, so the process's resident set stays at
its peak: SmolLM2's engine core sat at 2,745 MiB after start-up, 650 MiB of it the dropped session.
`malloc_trim(0)` returns the free pages (those in the middle of the heap too, since glibc 2.8). Elsewhere
(musl, macOS) there is no such call and nothing is done.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import gc
import logging
import os
from collections.abc import Callable
from functools import cache

log = logging.getLogger(__name__)


@cache
def _malloc_trim() -> Callable[[int], int] | None:
    try:  # find_library needs ldconfig or a compiler, which a slim image may lack
        trim: Callable[[int], int] = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6").malloc_trim
    except (OSError, AttributeError, TypeError):
        return None
    return trim


def resident_bytes() -> int | None:
    """This process's resident set now (Linux; None elsewhere)."""
    try:
        with open("/proc/self/statm") as statm:
            return int(statm.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError):
        return None


def give_back_freed_memory(why: str) -> int | None:
    """Collect garbage (dropped sessions), then hand the heap's free pages back; the bytes the resident set
    shrank by (None where that cannot be done or measured). Logged with `why`."""
    gc.collect()
    trim = _malloc_trim()
    before = resident_bytes()
    if trim is None or before is None:
        return None
    trim(0)
    after = resident_bytes()
    assert after is not None
    log.info(
        "%s: %d MiB resident, %d MiB freed memory handed back", why, after >> 20, max(0, before - after) >> 20
    )
    return before - after
