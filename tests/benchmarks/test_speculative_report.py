"""benchmarks.speculative's report and plot: each setting against the teacher alone, per stream count."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import typer

from benchmarks.speculative import draft_setting, plot, report


def load(rate: float, ttft_ms: float = 40.0) -> dict[str, float]:
    return {"tokens_per_s": rate, "ttft_p50_ms": ttft_ms, "requests": 12}


def test_each_setting_is_reported_and_drawn_against_the_teacher_alone(tmp_path: Path) -> None:
    texts = ["a b", "c d"]
    runs: dict[str, list[dict[str, Any]]] = {
        "off": [
            {
                "texts": texts,
                "loads": {1: load(30), 16: load(260)},
                "acceptance": None,
                "tokens_per_check": None,
            },
            {
                "texts": texts,
                "loads": {1: load(34), 16: load(280)},
                "acceptance": None,
                "tokens_per_check": None,
            },
        ],
        "k=2": [
            {
                "texts": texts,
                "loads": {1: load(40), 16: load(200, ttft_ms=180.0)},
                "acceptance": 0.5,
                "tokens_per_check": 1.9,
                "drafts_per_token": 0.8,
            },
            {
                "texts": texts,
                "loads": {1: load(44), 16: load(190, ttft_ms=220.0)},
                "acceptance": 0.4,
                "tokens_per_check": 1.8,
                "drafts_per_token": 0.9,
            },
        ],
        "k=3": [
            {
                "texts": ["a b", "x"],
                "loads": {1: load(32), 16: load(270)},
                "acceptance": 0.3,
                "tokens_per_check": 2.0,
            }
        ],
    }
    text = report("lm-teacher", runs, [1, 16], 2, 15, 32)
    rows = {line.split(" | ")[0].lstrip("| "): line for line in text.splitlines() if line.startswith("| k=")}
    assert "42 (1.31x)" in rows["k=2"] and "195 (0.72x)" in rows["k=2"]  # medians over rounds, / off's
    assert "| 40.0 | 200.0 | 0.45 | 1.85 | 0.85 | yes (2 prompts) |" in rows["k=2"]  # TTFT per stream count
    header, rule = (
        line for line in text.splitlines() if line.startswith("| setting") or line.startswith("|---")
    )
    assert "TTFT p50 ms, 1 stream | TTFT p50 ms, 16 streams" in header and rule.count("|") == header.count(
        "|"
    )
    assert "| 0.30 | 2.00 | - | NO (2 prompts) |" in rows["k=3"]  # a report from before the column
    assert rows["k=3"].endswith("| NO (2 prompts) |")  # a greedy text that differs is said so
    assert "- k=2, 1 stream: 1.33x / 1.29x" in text and "- k=2, 16 streams: 0.77x / 0.68x" in text
    assert "- k=3, 1 stream: 1.07x" in text  # a setting with fewer rounds: the rounds it has
    assert "Requests a server finished alone (median): 1 stream: 12, 16 streams: 12." in text
    plot("lm-teacher", runs, [1, 16], tmp_path / "speculative.png")
    assert (tmp_path / "speculative.png").stat().st_size > 1000


def test_a_draft_setting_is_checked_before_any_server_starts() -> None:
    assert draft_setting("5") == ("5",) and draft_setting(" 2:0 ") == ("2", "0")
    for bad in ("x", "0", "5:1.5", "5:sure"):
        with pytest.raises(typer.BadParameter, match="K:CONFIDENCE"):
            draft_setting(bad)
