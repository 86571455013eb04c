"""benchmarks.served_graphs: one model's graphs from several repositories served in turn, a report of each
one's tokens/s and time to first token beside the first repository's."""

from __future__ import annotations

import json
from pathlib import Path

from typer.testing import CliRunner

from benchmarks.served_graphs import app
from tests.conftest import TASK_MODEL_NAMES
from tests.tiny_models import CORPUS

MODEL = TASK_MODEL_NAMES["text-generation"]


def texts_file(path: Path) -> Path:
    lines = [" ".join(CORPUS[i % len(CORPUS) :] + CORPUS[: i % len(CORPUS)]) for i in range(200)]
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return path


def test_both_graphs_are_served_in_turn_and_reported_side_by_side(
    tiny_repository: Path, optimum_lm_repository: Path, tmp_path: Path
) -> None:
    """The appending graph (logits at the positions asked) and optimum's (every position's), each served
    by a fresh server: every request answered, each repository's figures in the report and its JSON."""
    args = ["--model", MODEL, "--repository", str(tiny_repository)]
    args += ["--repository", str(optimum_lm_repository), "--texts", str(texts_file(tmp_path / "texts.txt"))]
    args += ["--words", "12", "--streams", "1,2"]
    args += ["--seconds", "1", "--new-tokens", "4", "--rounds", "1", "--out", str(tmp_path / "out")]
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 0, result.output
    saved = json.loads((tmp_path / "out" / f"served-graphs-{MODEL}-w12.json").read_text())
    (measured,) = saved["rounds"]
    assert set(measured) == {str(tiny_repository), str(optimum_lm_repository)}
    for by_streams in measured.values():
        assert set(by_streams) == {"1", "2"}
        for figures in by_streams.values():
            assert figures["requests"] > 0 and figures["errors"] == 0 and figures["tokens_per_s"] > 0
    report = (tmp_path / "out" / f"served-graphs-{MODEL}-w12.md").read_text()
    assert report.count(f"| {optimum_lm_repository} |") == 2 and "1.000x" in report
    assert (tmp_path / "out" / f"served-graphs-{MODEL}-w12.png").stat().st_size > 0


def test_a_repository_at_two_prefix_cache_budgets_is_served_in_turn(
    tiny_repository: Path, tmp_path: Path
) -> None:
    """Prompts that share a preamble, served without a prefix cache and with one: the report names both
    servers, and only the one with a cache read prompt tokens from it."""
    args = ["--model", MODEL, "--repository", str(tiny_repository), "--prefix-cache-mb", "0,1"]
    args += ["--texts", str(texts_file(tmp_path / "texts.txt")), "--shared-words", "24", "--words", "3"]
    args += ["--streams", "1", "--seconds", "1", "--new-tokens", "4", "--rounds", "1", "--out", str(tmp_path)]
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 0, result.output
    (measured,) = json.loads((tmp_path / f"served-graphs-{MODEL}-w3-shared24.json").read_text())["rounds"]
    off, on = (measured[f"{tiny_repository}, prefix cache {mb} MB"]["1"] for mb in (0, 1))
    assert off["errors"] == on["errors"] == 0 and off["requests"] > 0 and on["requests"] > 0
    assert off["cached_share"] == 0 and on["cached_share"] > 0.3


def test_one_repository_or_one_without_the_model_is_refused(tiny_repository: Path, tmp_path: Path) -> None:
    texts = str(texts_file(tmp_path / "texts.txt"))
    one = ["--model", MODEL, "--repository", str(tiny_repository), "--texts", texts]
    alone = CliRunner().invoke(app, one)
    assert alone.exit_code == 2 and "two or more" in alone.output
    args = ["--model", MODEL, "--repository", str(tiny_repository), "--repository", str(tmp_path)]
    missing = CliRunner().invoke(app, [*args, "--texts", texts])
    assert missing.exit_code == 2 and f"no {MODEL} in {tmp_path}" in missing.output
    bad = CliRunner().invoke(app, [*one, "--prefix-cache-mb", "0,lots"])
    assert bad.exit_code == 2 and "'0,lots': a comma list of whole numbers from 0" in bad.output
    no_streams = CliRunner().invoke(app, [*one, "--prefix-cache-mb", "0,1", "--streams", "0"])
    assert no_streams.exit_code == 2 and "whole numbers from 1" in no_streams.output


def test_a_repository_in_two_variants_is_served_in_turn(tiny_repository: Path, tmp_path: Path) -> None:
    """`--variants`: each server told its DISTILSERVE_VARIANT (here fp32, and auto: the service's own
    choice), each named by it in the report."""
    args = ["--model", MODEL, "--repository", str(tiny_repository), "--variants", "fp32,auto"]
    args += ["--texts", str(texts_file(tmp_path / "texts.txt")), "--words", "3", "--streams", "1"]
    args += ["--seconds", "1", "--new-tokens", "4", "--rounds", "1", "--out", str(tmp_path)]
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 0, result.output
    (measured,) = json.loads((tmp_path / f"served-graphs-{MODEL}-w3-fp32-auto.json").read_text())["rounds"]
    assert set(measured) == {f"{tiny_repository}, fp32", f"{tiny_repository}, auto"}
    assert all(m["1"]["errors"] == 0 and m["1"]["requests"] > 0 for m in measured.values())
