"""One load level driven by wrk (C: the client must not measure itself), and what the server's own
metrics and /proc say of it: throughput, latency, mean batch, padding, engine busy share, CPU per request."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
from rich.console import Console

from benchmarks.servers import SERVER_PIDS
from loadtests.process_cpu import cpu_by_thread_name, per_request_ms

console = Console(stderr=True)

WRK_SCRIPT = r"""
local bodies = {}
for line in io.lines(os.getenv("BENCH_BODIES")) do bodies[#bodies + 1] = line end
local path = os.getenv("BENCH_PATH")
local headers = {["Content-Type"] = "application/json"}
request = function() return wrk.format("POST", path, headers, bodies[math.random(#bodies)]) end
done = function(summary, latency, requests)
  io.write(string.format(
    'BENCH {"requests":%d,"duration_us":%d,"p50_us":%d,"p99_us":%d,"status_errors":%d,"socket_errors":%d}\n',
    summary.requests, summary.duration, latency:percentile(50), latency:percentile(99), summary.errors.status,
    summary.errors.connect + summary.errors.read + summary.errors.write + summary.errors.timeout))
end
"""


@dataclass
class LoadResult:
    server: str
    connections: int
    rps: float
    p50_ms: float
    p99_ms: float
    errors: int
    client_cpu: float  # share of the machine's cores the load generator used
    mean_batch: float | None = None
    padding_efficiency: float | None = None
    engine_busy: float | None = None  # share of the time the engine instances were running batches
    cpu_ms: dict[str, float] | None = None  # CPU per request by thread name (frontend, core loop, engine)


def wrk(base: str, path: str, bodies: list[str], connections: int, seconds: int) -> dict[str, Any]:
    if shutil.which("wrk") is None:
        raise RuntimeError("wrk is not on PATH: `apt-get install wrk` (`make bench` installs it)")
    with tempfile.TemporaryDirectory() as tmp:
        script, body_file = Path(tmp) / "bench.lua", Path(tmp) / "bodies.jsonl"
        script.write_text(WRK_SCRIPT)
        body_file.write_text("\n".join(bodies) + "\n")
        threads = min(2, connections)
        command = ["wrk", "-t", str(threads), "-c", str(connections), "-d", f"{seconds}s", "--timeout", "30s"]
        command += ["-s", str(script), base]
        env = {**os.environ, "BENCH_BODIES": str(body_file), "BENCH_PATH": path}
        started = time.perf_counter()
        process = subprocess.Popen(
            command, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
        )
        _, _, usage = os.wait4(process.pid, 0)
        wall = time.perf_counter() - started
        output = process.stdout.read() if process.stdout else ""
    line = next((x for x in output.splitlines() if x.startswith("BENCH ")), None)
    if line is None:
        raise RuntimeError(f"wrk failed:\n{output}")
    result = json.loads(line[len("BENCH ") :])
    result["client_cpu"] = (usage.ru_utime + usage.ru_stime) / wall / (os.cpu_count() or 1)
    return result


def metric_totals(base: str) -> dict[str, float]:
    totals: dict[str, float] = {}
    for line in httpx.get(f"{base}/metrics", timeout=10).text.splitlines():
        if line.startswith("#") or not line.strip():
            continue
        name = line.split("{", 1)[0].split(" ", 1)[0]
        totals[name] = totals.get(name, 0.0) + float(line.rsplit(" ", 1)[1])
    return totals


def engine_instances(base: str) -> int:
    """Engine calls the server runs at once for an encoder model (in its one engine core)."""
    cards = httpx.get(f"{base}/v1/models", timeout=10).json()["models"]
    encoders = [c for c in cards if c["task"] != "text-generation"]
    return max((c["instances"] for c in encoders), default=1)


def load(name: str, base: str, path: str, bodies: list[str], connections: int, seconds: int) -> LoadResult:
    before = metric_totals(base) if name != "naive" else {}
    instances = engine_instances(base) if name != "naive" else 1
    pid = SERVER_PIDS.get(base)
    cpu_before = cpu_by_thread_name(pid) if pid is not None else {}
    out = wrk(base, path, bodies, connections, seconds)
    cpu_after = cpu_by_thread_name(pid) if pid is not None else {}
    result = LoadResult(
        server=name,
        connections=connections,
        rps=out["requests"] / (out["duration_us"] / 1e6),
        p50_ms=out["p50_us"] / 1000,
        p99_ms=out["p99_us"] / 1000,
        errors=out["status_errors"] + out["socket_errors"],
        client_cpu=out["client_cpu"],
        cpu_ms=per_request_ms(cpu_before, cpu_after, out["requests"]) if pid is not None else None,
    )
    if name != "naive":
        after = metric_totals(base)

        def delta(key: str) -> float:
            return after.get(key, 0.0) - before.get(key, 0.0)

        calls = delta("distilserve_batch_size_count")
        result.mean_batch = delta("distilserve_batch_size_sum") / calls if calls else None
        padded = delta("distilserve_batch_padded_tokens_total")
        result.padding_efficiency = delta("distilserve_batch_real_tokens_total") / padded if padded else None
        busy_s = delta("distilserve_inference_duration_seconds_sum")
        result.engine_busy = busy_s / (out["duration_us"] / 1e6) / instances
    console.print(
        f"  {name:>12} c={connections:<3} {result.rps:8.1f} req/s  p50 {result.p50_ms:6.1f} ms  "
        f"p99 {result.p99_ms:7.1f} ms  errors {result.errors}"
    )
    return result
