"""Resident memory and open file descriptors of every process of a server, read from /proc (Linux).

Sampled every few seconds through a long run, they show a leak where a run's totals cannot: memory that
grows with the requests served, descriptors (sockets, files) that are opened and never closed. Each
process is named for what it is, so a figure says which one grows: the process started (`supervisor`),
distilserve's named children (`ds-engine-core`, `ds-frontend`, numbered when there are several) and
multiprocessing's `resource-tracker`.
"""

from __future__ import annotations

import os
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

from loadtests.process_cpu import tree

PAGE_KIB = os.sysconf("SC_PAGE_SIZE") // 1024


@dataclass(frozen=True)
class ProcessSample:
    """One process at one moment."""

    name: str
    pid: int
    rss_mib: float
    fds: int


def rss_mib(pid: int) -> float:
    """Resident set size in MiB (the second field of /proc/PID/statm, in pages)."""
    pages = int(Path(f"/proc/{pid}/statm").read_text().split()[1])
    return pages * PAGE_KIB / 1024


def open_fds(pid: int) -> int:
    return len(os.listdir(f"/proc/{pid}/fd"))


def role(pid: int, root: int) -> str:
    """What a process of the tree is: the root is the supervisor, a child its thread-set name."""
    if pid == root:
        return "supervisor"
    comm = Path(f"/proc/{pid}/comm").read_text().strip()
    if comm.startswith("ds-"):
        return comm
    cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
    return "resource-tracker" if "resource_tracker" in cmdline else comm


def sample_tree(root: int) -> list[ProcessSample]:
    """Every live process of `root`'s tree; processes of the same role are numbered in pid order
    (`ds-frontend-1`, `ds-frontend-2`) so that a series follows one slot even when its process is replaced.
    A process that exits while it is read is left out."""
    seen = []
    for pid in sorted(tree(root)):
        try:
            seen.append((role(pid, root), pid, rss_mib(pid), open_fds(pid)))
        except (OSError, ValueError, IndexError):
            continue
    several = {name for name, count in Counter(name for name, *_ in seen).items() if count > 1}
    numbered: Counter[str] = Counter()
    samples = []
    for name, pid, rss, fds in seen:
        if name in several:
            numbered[name] += 1
            name = f"{name}-{numbered[name]}"
        samples.append(ProcessSample(name, pid, rss, fds))
    return samples
