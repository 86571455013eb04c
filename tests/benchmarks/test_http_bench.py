"""The service benchmark's own pieces: its streaming client counts what the server sent, its ceiling
reference computes what the service does, its ratios pair adjacent measurements, and the report states
them."""

from __future__ import annotations

from pathlib import Path

import httpx

from benchmarks.http_bench import BARE, bars, generation_ratios, render
from benchmarks.servers import serve
from benchmarks.streams import generation_load
from benchmarks.wrk_load import LoadResult
from tests.conftest import TASK_MODEL_NAMES
from tests.service.live_server import live_server


def test_the_streaming_client_counts_every_token_of_every_request(tiny_repository: Path) -> None:
    with live_server(tiny_repository, {"DISTILSERVE_LOG_LEVEL": "warning"}) as server:  # its pipe is unread
        prompts = ["the film", "a slow and tender story", "it was"]  # well inside the tiny model's window
        g = generation_load(server.base_url, TASK_MODEL_NAMES["text-generation"], 3, 2.0, 12, prompts)
    assert g["requests"] >= 3 and g["errors"] == 0
    assert g["tokens"] == 12 * g["requests"]  # ignore_eos: every request streams exactly its 12 tokens
    assert 0 < g["ttft_p50_ms"] <= g["ttft_p99_ms"]


def test_the_bare_reference_server_answers_as_the_service_does(tiny_repository: Path) -> None:
    """Its throughput is only a ceiling for the service's if it does the service's work: same labels."""
    texts = ["a warm and funny film", "dull", "the plot " * 40]  # the last one past the tiny window
    model = TASK_MODEL_NAMES["text-classification"]
    answers = []
    for module, ready in (("service", "/ready"), ("benchmarks.bare_server", "/v1/models")):
        with serve(tiny_repository, {}, module=module, ready=ready) as base:
            answers.append(
                [httpx.post(f"{base}/v1/classify", json={"inputs": t, "model": model}).json() for t in texts]
            )
            if module != "service":
                bad = httpx.post(f"{base}/v1/classify", content=b"{not json")
                assert bad.status_code == 400
                metrics = httpx.get(f"{base}/metrics").text  # what the benchmark reads from it
                assert f'distilserve_batch_size_count{{model="{model}"}} 3.0' in metrics
    service, bare = answers
    assert bare == service and all(len(row) == 1 and row[0]["label"] for row in bare)


def pair(engine: str, streams: int, rate: float, index: int) -> dict:
    return {
        "engine": engine,
        "streams": streams,
        "tokens_per_s": rate,
        "ttft_p50_ms": 1.0,
        "ttft_p99_ms": 2.0,
        "requests": 10,
        "errors": 0,
        "pair": index,
    }


def test_ratios_pair_adjacent_runs_and_the_report_gives_their_median() -> None:
    generation = [
        pair("continuous", 1, 100, 0),
        pair("one-at-a-time", 1, 100, 0),
        *(
            row
            for i, (fast, slow) in enumerate([(800, 200), (900, 150), (500, 200)])
            for row in (pair("continuous", 16, fast, i), pair("one-at-a-time", 16, slow, i))
        ),
    ]
    assert generation_ratios(generation, 16) == [4.0, 6.0, 2.5]
    assert generation_ratios(generation, 1) == [1.0]
    report = render({}, [], generation)
    assert "at 16 streams, each pair measured back to back: 4.00x, 6.00x, 2.50x; median **4.00x**" in report


def result(
    server: str, connections: int, rps: float, p50_ms: float = 10.0, padding: float = 0.9
) -> LoadResult:
    return LoadResult(server, connections, rps, p50_ms, 2 * p50_ms, 0, 0.01, 4.0, padding)


def test_the_report_states_each_bar_with_its_figures_and_verdict() -> None:
    loads = [
        result("batching", 1, 100, p50_ms=3.4),
        result("batch-1", 1, 100, p50_ms=2.0),
        result("batching", 64, 700),
        result("batch-1", 64, 500),
        result("batching, 2 frontends", 64, 920),
        result("naive", 64, 100),
    ]
    assert bars(loads, 1000.0, "cpu")[2:8] == [
        "- served ÷ best raw ≥ 0.9: 0.70 (batching), 0.92 (batching, 2 frontends) ✔",
        "- batching ÷ batch 1 ≥ 1x: 1.40x ✔",
        "- 2 frontends ÷ 1: throughput ≥ 1.0x and mean batch ≥ 0.9x: 1.31x, batch 1.00x ✔",
        "- padding efficiency ≥ 0.85: 0.90 ✔",
        "- 1 client: p50 within 1 ms of batch 1: 3.4 vs 2.0 ms ✘",
        "- ≥ 3x the naive server: 7.0x ✔",
    ]
    gpu = bars(loads, 1000.0, "gpu")
    assert "- batching ÷ batch 1 ≥ 10x: 1.40x ✘" in gpu
    assert "- served ÷ best raw ≥ 0.3: 0.70 (batching), 0.92 (batching, 2 frontends) ✔" in gpu
    # with --frontends, batching is also set against batch 1 run with as many frontends
    same_processes = bars([*loads, result("batch-1, 2 frontends", 64, 600)], 1000.0, "cpu")
    assert "- batching ÷ batch 1 ≥ 1x: 1.40x (1 frontend), 1.53x (2 frontends) ✔" in same_processes
    with_bare = bars([*loads, result(BARE, 64, 1000)], 1000.0, "cpu")
    assert any(
        line.startswith("- served ÷ the bare ASGI server ≥ 0.9: 0.92 (batching, 2 frontends)")
        and "reaches 1.00 of best raw" in line
        and line.endswith("✔")
        for line in with_bare
    )
    loads[2].cpu_ms = {"ds-engine": 0.8, "ds-frontend": 0.31}
    assert bars(loads, 1000.0, "cpu")[-1] == "- batching: ds-engine 0.800, ds-frontend 0.310"
    loads[2].engine_busy = 0.5
    section = {"raw": {"b8": 1000.0}, "load": loads}
    report = render({"m": section}, [], [])
    assert "0.70 (batching), 0.92 (batching, 2 frontends) ✔" in report
    assert "| batching | 64 | 700 | 10.0 | 20.0 | 0 | 4.0 | 0.90 | 0.70 | 50% | 1% |" in report
    assert "| naive | 64 | 100 | 10.0 | 20.0 | 0 | 4.0 | 0.90 | 0.10 | - | 1% |" in report
