"""benchmarks.plots, and the reports that draw with it: each writes its PNG from results of its own shape."""

from __future__ import annotations

from pathlib import Path

import matplotlib.pyplot as plt
import pytest

from benchmarks import cascade, engine_bench, http_bench, rerank, version_switch
from benchmarks.cascade_eval import Quality
from benchmarks.plots import saved_axes, saved_figure
from benchmarks.wrk_load import LoadResult

PNG = b"\x89PNG"


def test_a_figure_is_saved_with_its_columns_and_closed(tmp_path: Path) -> None:
    out = tmp_path / "two.png"
    with saved_figure(out, (6, 3), columns=2) as axes:
        assert len(axes) == 2
        for i, axis in enumerate(axes):
            axis.plot([1, 2], [i, i + 1])
    assert out.read_bytes().startswith(PNG)
    assert plt.get_fignums() == []


def test_a_figure_whose_drawing_fails_is_closed_and_not_written(tmp_path: Path) -> None:
    out = tmp_path / "failed.png"
    with pytest.raises(ValueError, match="bad data"), saved_axes(out, (4, 3), "t", "x", "y"):
        raise ValueError("bad data")
    assert not out.exists()
    assert plt.get_fignums() == []


def test_each_report_draws_its_results(tmp_path: Path) -> None:
    quality = Quality(0.87, 0.88, 0.88, 0.2, 0.99, 0.93, 0.82, {})
    cascade.plot(
        [(0.9, 0.2, 0.88), (0.5, 0.05, 0.87)],
        [(0.0, 0.87), (0.1, 0.88)],
        quality,
        "sst2",
        "accuracy",
        tmp_path / "c.png",
    )
    rows = [engine_bench.Row("classification", "student", 10, {}, {("fp32", 1): 1.0, ("int8", 32): 3.0})]
    engine_bench.plot(rows, "cpu", tmp_path / "e.png")
    loads = [LoadResult("batching", n, 100.0 * n, 5.0, 9.0, 0, 0.1) for n in (1, 8, 64)]
    generation = [{"engine": "continuous", "streams": n, "tokens_per_s": 50.0 * n} for n in (1, 16)]
    http_bench.plot({"sentiment": {"load": loads, "raw": {32: 900.0}}}, generation, tmp_path / "h.png")
    answers = [
        version_switch.Answer(0.1 * i, 0.01 + 0.001 * i, 200, "1" if i < 20 else "2") for i in range(40)
    ]
    marks = {"landed_s": 1.5, "unloaded_s": 2.5, "first_new_s": 2.0}
    version_switch.plot(answers, marks, tmp_path / "v.png")
    rankers = [
        {"ranker": spec, "recall_at_1": 0.7 + 0.01 * i, "qps": 10.0 - i}
        for i, spec in enumerate(["ranker:0", "ranker:1", "ranker", "ranker-teacher"])
    ]
    rerank.plot_rankers(rankers, tmp_path / "r.png", "reranked")
    for name in "cehvr":
        assert (tmp_path / f"{name}.png").read_bytes().startswith(PNG)
    assert plt.get_fignums() == []
