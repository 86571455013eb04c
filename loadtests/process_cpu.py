"""CPU time a server's processes spend, by thread name, read from /proc (Linux).

Sampled before and after a load, the difference divided by the requests served is the CPU each request
costs each part of the server. distilserve names its threads (`ds-frontend`: a frontend's event loop and
helpers; `ds-engine-core`: the core's event loop and ONNX Runtime's own threads it starts; `ds-engine`: the
engine threads that run the batches), so a figure says which part pays. Such figures do not depend on how
busy the machine was, unlike throughput.
"""

from __future__ import annotations

import os
from collections import defaultdict
from pathlib import Path

TICKS = os.sysconf("SC_CLK_TCK")


def tree(root: int) -> list[int]:
    """`root` and all its descendants."""
    pids, todo = [], [root]
    while todo:
        pid = todo.pop()
        pids.append(pid)
        try:
            todo.extend(int(c) for c in Path(f"/proc/{pid}/task/{pid}/children").read_text().split())
        except OSError:
            continue
    return pids


def cpu_by_thread_name(root: int) -> dict[str, float]:
    """CPU seconds (user + system) of every thread of `root`'s process tree, summed by thread name."""
    out: dict[str, float] = defaultdict(float)
    for pid in tree(root):
        try:
            tasks = list(Path(f"/proc/{pid}/task").iterdir())
        except OSError:
            continue
        for task in tasks:
            try:
                stat = (task / "stat").read_text()
                name = (task / "comm").read_text().strip()
            except OSError:
                continue
            fields = stat[stat.rindex(")") + 2 :].split()
            out[name] += (int(fields[11]) + int(fields[12])) / TICKS  # utime, stime
    return dict(out)


def per_request_ms(before: dict[str, float], after: dict[str, float], requests: int) -> dict[str, float]:
    """Milliseconds of CPU per request, by thread name (names that spent nothing left out)."""
    spent = {name: after[name] - before.get(name, 0.0) for name in after}
    return {name: 1000 * s / max(1, requests) for name, s in sorted(spent.items()) if s > 0}


def machine_busy_s(stat: Path = Path("/proc/stat")) -> float:
    """CPU seconds all cores of the machine have been busy since boot (every state but idle and iowait):
    set beside a server's own, it tells how much other work shared the machine during a measurement."""
    fields = [int(x) for x in stat.read_text().splitlines()[0].split()[1:]]
    return (sum(fields[:8]) - fields[3] - fields[4]) / TICKS  # user..steal; guest is within user
