"""The engine alone: ONNX Runtime's sequences/s for a model version, in a fresh process per measurement.

    python -m benchmarks.raw_engine VERSION_DIR BATCH [--threads N] [--instances K] [--device gpu]

What no server in front of it can exceed; the HTTP benchmark divides served throughput by its best.
"""

from __future__ import annotations

import random
import subprocess
import sys
import time
from pathlib import Path

from common.cli import one_command_app
from loadtests.texts import reviews


def raw_throughput(
    version_dir: Path,
    texts: list[str],
    batch: int,
    threads: int,
    device: str = "cpu",
    seconds: float = 4.0,
    instances: int = 1,
) -> float:
    """Sequences/s of ONNX Runtime alone over `texts`, batches of similar lengths padded to their longest;
    `instances` calls at once on the one session (as the service runs them), `threads` each."""
    from concurrent.futures import ThreadPoolExecutor

    from service.engine import OrtEngine
    from service.repository import read_version
    from service.runtime import choose_variant
    from service.tokenization import TextEncoder, pad_batch

    version = read_version(version_dir)
    m = version.manifest
    engine = OrtEngine(
        version.file(m.variants[choose_variant(m, "auto", on_gpu=device == "gpu")].file),
        device=device,
        require_gpu=device == "gpu",
        intra_op_threads=threads,
    )
    encoder = TextEncoder(version.file(m.tokenizer.file), m.tokenizer)
    rows = sorted(encoder.encode(texts), key=len)
    batches = [pad_batch(rows[i : i + batch], m.tokenizer.pad_token_id) for i in range(0, len(rows), batch)]
    random.Random(0).shuffle(batches)
    names = set(engine.input_names)

    def instance(k: int) -> int:
        """One instance's share of the batches, back to back; returns the sequences it ran."""
        done, i = 0, k
        while time.perf_counter() - started < seconds or done < 2 * batch:
            feeds = batches[i % len(batches)]
            engine.run({n: v for n, v in feeds.items() if n in names})
            done += feeds["input_ids"].shape[0]
            i += instances
        return done

    started = time.perf_counter()
    with ThreadPoolExecutor(max_workers=instances) as pool:
        done = sum(pool.map(instance, range(instances)))
    return done / (time.perf_counter() - started)


def raw_command(
    version_dir: Path, batch: int, threads: int = 2, device: str = "cpu", instances: int = 1
) -> None:
    """Print the sequences/s of the model version at `version_dir` alone, batches of `batch`."""
    print(raw_throughput(version_dir, reviews(2000, seed=1), batch, threads, device, instances=instances))


def raw_in_process(version_dir: Path, batch: int, device: str, instances: int = 1) -> float:
    """In a fresh process, with the cores split between `instances` concurrent calls."""
    from service.engine import available_cores

    threads = max(1, available_cores() // instances)
    command = [sys.executable, "-m", "benchmarks.raw_engine", str(version_dir), str(batch)]
    command += ["--device", device, "--threads", str(threads), "--instances", str(instances)]
    return float(
        subprocess.run(command, capture_output=True, text=True, check=True).stdout.strip().splitlines()[-1]
    )


def raw_engine(version_dir: Path, device: str) -> dict[str, float]:
    """The engine's throughput at each batch size, as one call on every core ("b8") and, on a CPU, as one
    single-threaded call per core at once ("b8 2x1", the service's CPU default): the best any server gets."""
    from service.engine import available_cores

    cores = available_cores()
    raw = {f"b{b}": raw_in_process(version_dir, b, device) for b in (1, 8, 32, 64)}
    if device == "cpu" and cores > 1:
        raw |= {f"b{b} {cores}x1": raw_in_process(version_dir, b, device, cores) for b in (1, 8, 32, 64)}
    return raw


if __name__ == "__main__":
    one_command_app(raw_command)()
