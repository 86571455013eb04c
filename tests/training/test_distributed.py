"""Two CPU processes (torchrun, gloo) distil a tiny student: the data is split between them, both end with
the same weights, and a run killed mid-epoch resumes to those same weights on both."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest

WORKER = Path(__file__).with_name("distributed_worker.py")
ROOT = Path(__file__).parents[2]
EXAMPLES, EPOCHS = 32, 2  # as in the worker


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@pytest.mark.timeout(120)
def test_two_processes_split_the_data_and_agree_on_the_weights(tmp_path: Path) -> None:
    env = {
        **os.environ,
        "MASTER_ADDR": "127.0.0.1",
        "OMP_NUM_THREADS": "1",
        "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])),
        "CUDA_VISIBLE_DEVICES": "",
    }
    command = [
        sys.executable, "-m", "torch.distributed.run", "--nnodes", "1", "--nproc-per-node", "2",
        "--master-addr", "127.0.0.1", "--master-port", str(_free_port()), str(WORKER), str(tmp_path),
    ]  # fmt: skip
    done = subprocess.run(command, cwd=ROOT, env=env, capture_output=True, text=True, timeout=110)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]

    ranks = [json.loads((tmp_path / f"rank-{i}.json").read_text()) for i in range(2)]
    # Each rank trained on its own half of every epoch; together they saw every example once per epoch.
    per_epoch = [
        [r["seen"][e * EXAMPLES // 2 : (e + 1) * EXAMPLES // 2] for r in ranks] for e in range(EPOCHS)
    ]
    for first, second in per_epoch:
        assert len(first) == len(second) == EXAMPLES // 2
        assert sorted(first + second) == list(range(EXAMPLES))
    # Throughput counts both processes' examples.
    assert [e["examples"] for e in ranks[0]["epochs"]] == [EXAMPLES] * EPOCHS
    timing = ("seconds", "examples_per_s")
    same = [[{k: v for k, v in e.items() if k not in timing} for e in r["epochs"]] for r in ranks]
    assert same[0] == same[1] and same[0][-1]["accuracy"] == 0.5  # eval metrics shared by the main process
    # DDP kept the replicas identical, and the resumed run reached the same weights on both ranks.
    assert ranks[0]["straight"] == ranks[1]["straight"]
    assert ranks[0]["resumed"] == ranks[1]["resumed"] == ranks[0]["straight"]
