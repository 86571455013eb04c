"""ONNX Runtime's optimised graphs kept on disk between starts (`DISTILSERVE_GRAPH_CACHE_DIR`).

Opening a session parses the exported graph and runs ONNX Runtime's graph optimisations (constant folding,
operator fusions, layout changes) before the first call: for SmolLM2's 30-layer teacher that is most of its
2-4 s of session time, paid again by every start, every replica and every version switch. ONNX Runtime can
write the graph it ends up with (`SessionOptions.optimized_model_filepath`); a later start that opens that
file with the optimisations off skips the work. TensorRT's engine cache is the same idea one level down.

An optimised graph at the full level may hold kernels and layouts chosen for this processor, so a cached
file is keyed by the exported file's sha256 (the manifest's, checked at load), ONNX Runtime's version, the
optimisation level and this CPU's model and instruction-set flags: a new version, a new runtime or another
machine type misses and writes its own. CPU sessions only: a GPU graph is partitioned between providers.
A file is written under a temporary name and renamed, so a start that dies mid-write leaves no half graph.
Each file opened is touched; writing a new one removes those no start has opened for `UNUSED_DAYS` (the
graphs of versions long retired), so the directory holds what is served, not every version ever served.
"""

from __future__ import annotations

import contextlib
import hashlib
import logging
import os
import platform
import time
import uuid
from functools import cache
from pathlib import Path

import onnxruntime as ort

log = logging.getLogger(__name__)

LEVEL = "all"  # the level the cached graphs were optimised at (ORT_ENABLE_ALL, what every session uses)
UNUSED_DAYS = 7.0


@cache
def machine_tag() -> str:
    """What an optimised graph may depend on besides the model: the runtime and this processor."""
    cpu = platform.machine()
    try:
        info = Path("/proc/cpuinfo").read_text()
    except OSError:
        info = ""
    for line in info.splitlines():  # the first processor's model and flags: they pick the kernels
        if line.startswith(("model name", "flags", "Features")):
            cpu += "|" + line.split(":", 1)[1].strip()
        if line.strip() == "":
            break
    return f"{ort.__version__}|{LEVEL}|{hashlib.sha256(cpu.encode()).hexdigest()[:16]}"


def cached_graph(directory: Path, sha256: str) -> Path:
    """Where the optimised form of the exported file with this sha256 lives for this machine."""
    key = hashlib.sha256(f"{sha256}|{machine_tag()}".encode()).hexdigest()[:32]
    return directory / f"{key}.onnx"


def writing_path(cached: Path) -> Path:
    """The temporary name ONNX Runtime writes to, one per session being opened (replicas sharing the cache,
    or two loads in one process); `keep` renames it once the session opened."""
    return cached.with_name(f"{cached.stem}.{os.getpid()}.{uuid.uuid4().hex[:8]}.writing")


def prepare(cached: Path) -> bool:
    """Whether a graph may be written at `cached` (its directory can be made): else the session just opens."""
    try:
        cached.parent.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        log.warning("graph cache %s is not writable (%s): sessions open without it", cached.parent, e)
        return False
    return os.access(cached.parent, os.W_OK)


def keep(written: Path, cached: Path) -> None:
    """Move the graph ONNX Runtime wrote into place (an ONNX Runtime that wrote nothing leaves no file)."""
    try:
        if written.exists() and written.stat().st_size > 0:
            os.replace(written, cached)
            log.info("optimised graph cached at %s", cached)
            prune(cached.parent)
    except OSError as e:
        log.warning("could not cache the optimised graph at %s: %s", cached, e)
    finally:
        written.unlink(missing_ok=True)


def opened(cached: Path) -> None:
    """A start used this graph: it stays (see `prune`)."""
    with contextlib.suppress(OSError):  # a read-only cache still serves; it is just never pruned
        os.utime(cached)


def prune(directory: Path, unused_days: float = UNUSED_DAYS) -> list[Path]:
    """Remove the graphs no start has opened for `unused_days`; returns them."""
    cutoff = time.time() - unused_days * 86400
    removed = []
    for path in directory.glob("*.onnx"):
        try:
            if path.stat().st_mtime < cutoff:
                path.unlink()
                removed.append(path)
        except OSError:  # another process removed it first, or the directory is read-only
            continue
    if removed:
        log.info("graph cache %s: removed %d graphs unused for %g days", directory, len(removed), unused_days)
    return removed


def forget(cached: Path) -> None:
    """Drop a cached graph that did not open (truncated, or from a runtime that wrote it differently)."""
    log.warning("cached graph %s did not open: removed, the exported graph is optimised again", cached)
    with contextlib.suppress(OSError):  # a read-only cache: the exported graph still opens
        cached.unlink(missing_ok=True)
