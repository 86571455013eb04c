"""The engine alone with and without IO binding, side by side in one process, rounds alternating.

    python -m benchmarks.io_binding_bench export build/demo/text-generation/student build/bench-models/optimum
    python -m benchmarks.io_binding_bench encoder models/sentiment/1 [--device gpu] [--rounds 3]
    python -m benchmarks.io_binding_bench decoder build/bench-models/optimum/lm/1 [--device gpu]

`encoder`: ms per call of one model version's session run plainly (numpy in and out) and through IO binding
(service.engine.OrtEngine with io_binding off / on), batches 1, 8 and 32 of random ids.
`decoder`: tokens/s of the generation runner alone (service.generation.runner.DecoderRunner), continuous
batching of `--streams` sequences whose arrivals and lengths are staggered, with the host KV cache (binding
off) and with binding on: for optimum's graph (present = past + new) that keeps the cache on the device
between decode steps; with distilserve's appending graph it only binds the inputs and outputs. It also
reports the device cache's rebuilds (on the device, in every step whose rows changed) and the joining rows'
bytes they uploaded, and checks that both ways generate the same tokens.
`export`: writes a decoder HF directory as optimum's graph (needs the exporter's dependencies; run it on the
CPU host and carry the repository to a GPU machine).
"""

from __future__ import annotations

import json
import statistics
import time
from collections.abc import Callable
from pathlib import Path
from typing import Annotated, Any

import numpy as np
import typer

from common.cli import cli_app

app = cli_app(help="The engine with and without IO binding, side by side.")
BATCHES = (1, 8, 32)


def _engine(version_dir: Path, io_binding: str, device: str, variant: str) -> Any:
    from service.engine import OrtEngine
    from service.repository import read_version
    from service.runtime import choose_variant

    version = read_version(version_dir)
    m = version.manifest
    chosen = choose_variant(m, variant, on_gpu=device == "gpu")
    path = version.file(m.variants[chosen].file)
    return OrtEngine(path, device=device, require_gpu=device == "gpu", io_binding=io_binding)  # type: ignore[arg-type]


def _rate(work: Callable[[], int], seconds: float) -> float:
    """Units of `work` per second, run back to back for `seconds` (after one warm-up call)."""
    work()
    done, started = 0, time.perf_counter()
    while time.perf_counter() - started < seconds:
        done += work()
    return done / (time.perf_counter() - started)


def _calls(engine: Any, feeds: dict[str, np.ndarray]) -> Callable[[], int]:
    def call() -> int:
        engine.run(feeds)
        return 1

    return call


@app.command()
def encoder(
    version_dir: Path,
    device: str = "cpu",
    variant: str = "auto",
    length: int = 64,
    seconds: Annotated[float, typer.Option(help="Per engine, batch and round.")] = 1.0,
    rounds: int = 3,
    out: Path | None = None,
) -> None:
    """Median ms per call, plain vs bound, per batch size; ratio > 1: binding is faster."""
    engines = {b: _engine(version_dir, b, device, variant) for b in ("off", "on")}
    names = engines["off"].input_names
    rng = np.random.default_rng(0)
    rows = []
    for batch in BATCHES:
        ids = rng.integers(5, 100, size=(batch, length), dtype=np.int64)  # in every demo vocabulary
        arrays = {"input_ids": ids, "attention_mask": np.ones_like(ids), "token_type_ids": np.zeros_like(ids)}
        feeds = {k: v for k, v in arrays.items() if k in names}
        ms: dict[str, list[float]] = {"off": [], "on": []}
        for _ in range(rounds):
            for binding, engine in engines.items():  # alternating, so drift on a shared machine hits both
                ms[binding].append(1000.0 / _rate(_calls(engine, feeds), seconds))
        plain, bound = statistics.median(ms["off"]), statistics.median(ms["on"])
        rows.append({"batch": batch, "plain_ms": plain, "bound_ms": bound, "plain_over_bound": plain / bound})
    _report(
        rows,
        f"encoder {version_dir} on {engines['on'].provider}, length {length}",
        ["batch", "plain_ms", "bound_ms", "plain_over_bound"],
        out,
    )


@app.command()
def decoder(
    version_dir: Path,
    device: str = "cpu",
    variant: str = "fp32",
    streams: int = 16,
    sequences: Annotated[int, typer.Option(help="Sequences per round; arrivals staggered.")] = 32,
    new_tokens: int = 48,
    rounds: int = 3,
    out: Path | None = None,
) -> None:
    """Generated tokens/s of the runner alone, host cache (binding off) vs binding on; ratio > 1: on is
    faster. One round: `sequences` prompts, at most `streams` running, one joining every other step."""
    from service.generation.runner import DecoderRunner, cache_device
    from service.repository import read_version

    layout = read_version(version_dir).manifest.generation
    assert layout is not None, f"{version_dir} is not a decoder"
    engines = {b: _engine(version_dir, b, device, variant) for b in ("off", "on")}
    rng = np.random.default_rng(0)
    prompts = [rng.integers(5, 100, size=int(rng.integers(4, 32))).tolist() for _ in range(sequences)]
    lengths = [new_tokens // 2 + int(rng.integers(0, new_tokens // 2 + 1)) for _ in range(sequences)]
    rates: dict[str, list[float]] = {"off": [], "on": []}
    outputs: dict[str, list[list[int]]] = {}
    trips: dict[str, Any] = {}
    for _ in range(rounds):
        for binding, engine in engines.items():
            runner = DecoderRunner(engine, layout)
            started = time.perf_counter()
            outputs[binding], steps, placed = _continuous(runner, prompts, lengths, streams)
            rates[binding].append(sum(map(len, outputs[binding])) / (time.perf_counter() - started))
            if binding == "on":
                trips = {
                    "cache": f"device ({placed})" if cache_device(engine, layout) else "host",
                    "steps": steps,
                    "rebuilds": runner.row_gather.rebuilds if runner.row_gather else 0,
                    "uploaded_mb": runner.row_gather.uploaded_bytes / 2**20 if runner.row_gather else 0.0,
                }
    off, on = statistics.median(rates["off"]), statistics.median(rates["on"])
    same = outputs["on"] == outputs["off"]  # greedy: the cache's place must not change a token
    row = {"streams": streams, "off_tokens_s": off, "on_tokens_s": on, "on_over_off": on / off, **trips}
    row["same_tokens"] = same
    title = f"decoder {version_dir} ({layout.present_positions} presents) on {engines['on'].provider}"
    _report([row], title, list(row), out)
    if not same:
        raise SystemExit("binding on and off generated different tokens")


def _continuous(
    runner: Any, prompts: list[list[int]], lengths: list[int], streams: int
) -> tuple[list[list[int]], int, str]:
    """Greedy continuous batching as the scheduler does it: every output, the steps run, and where a
    device cache's tensors were (ONNX Runtime's device name of its past, read once)."""
    from service.generation.device_cache import DeviceCache
    from service.generation.sampling import SamplingParams
    from service.generation.scheduler import StepPlan
    from service.generation.sequence import Sequence

    waiting = [Sequence(p, SamplingParams(max_new_tokens=n)) for p, n in zip(prompts, lengths, strict=True)]
    running: list[Sequence] = []
    everyone, steps, placed = list(waiting), 0, ""
    while waiting or running:
        joining = [waiting.pop(0)] if waiting and len(running) < streams and steps % 2 == 0 else []
        produced = runner.execute(StepPlan(prefill=joining, decode=running)).tokens
        for seq in [*joining, *running]:
            seq.output.append(produced[seq.id])
        if not placed and isinstance(runner._cache, DeviceCache):
            placed = runner._cache.device_name
        running = [s for s in [*running, *joining] if len(s.output) < s.params.max_new_tokens]
        steps += 1
    return [s.output for s in everyone], steps, placed


@app.command()
def export(hf_dir: Path, repository: Path, name: str = "lm") -> None:
    """`hf_dir` (a GPT-2 or Llama-family decoder) as optimum's graph, fp32, as REPOSITORY/NAME/<version>."""
    import export.tasks
    from export.pipeline import export_model

    export.tasks.appends = lambda config: False  # optimum's graph: present = past + new
    result = export_model(hf_dir, "text-generation", name, repository, ("fp32",), require_eval_data=False)
    print(result.version_dir)


def _report(rows: list[dict[str, Any]], title: str, columns: list[str], out: Path | None) -> None:
    def cell(value: Any) -> str:
        return f"{value:.3f}" if isinstance(value, float) else str(value)

    lines = [f"### {title}", "", "| " + " | ".join(columns) + " |", "|" + "---|" * len(columns)]
    lines += ["| " + " | ".join(cell(r[c]) for c in columns) + " |" for r in rows]
    print("\n".join(lines))
    if out is not None:
        out.write_text(json.dumps({"title": title, "rows": rows}, indent=1) + "\n", encoding="utf-8")


if __name__ == "__main__":
    app()
