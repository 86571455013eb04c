"""loadtests.report on small synthetic locust CSVs (the columns locust 2.47 writes)."""

from __future__ import annotations

from pathlib import Path

import pytest

from loadtests.report import main, read_history, write_report

PERCENTILES = "50%,66%,75%,80%,90%,95%,98%,99%,99.9%,99.99%,100%"
STATS_HEADER = (
    "Type,Name,Request Count,Failure Count,Median Response Time,Average Response Time,Min Response Time,"
    f"Max Response Time,Average Content Size,Requests/s,Failures/s,{PERCENTILES}"
)
STATS = f"""{STATS_HEADER}
POST,/v1/classify,1000,30,12,15.5,3,210,60,50.0,1.5,12,14,16,18,25,40,60,90,200,210,210
POST,/v1/classify [bad -> 422],50,0,4,4.2,2,9,80,2.5,0.0,4,4,5,5,6,7,8,9,9,9,9
POST,/v1/generate [stream],200,2,300,320.0,80,900,400,10.0,0.1,300,320,340,360,400,500,700,800,900,900,900
SSE,/v1/generate [stream] first token,198,0,20,22.0,5,90,0,9.9,0.0,20,22,24,25,30,45,60,80,90,90,90
,Aggregated,1448,32,14,60.1,2,900,98,72.4,1.6,14,18,22,30,200,310,500,700,900,900,900
"""
FAILURES = """Method,Name,Error,Occurrences,First Seen,Last Seen
POST,/v1/classify,429 Too Many Requests (queue full),28,2026-11-22T19:00:01Z,2026-11-22T19:00:19Z
POST,/v1/classify,500 (expected 200): {"error": "boom"},2,2026-11-22T19:00:05Z,2026-11-22T19:00:06Z
POST,/v1/generate [stream],"HTTPError('429 Client Error: Too Many Requests for url: /v1/generate')",2,x,y
"""
HISTORY_HEADER = (
    f"Timestamp,User Count,Type,Name,Requests/s,Failures/s,{PERCENTILES},Total Request Count,"
    "Total Failure Count,Total Median Response Time,Total Average Response Time,Total Min Response Time,"
    "Total Max Response Time,Total Average Content Size"
)
NA = ",".join(["N/A"] * 11)
HISTORY = f"""{HISTORY_HEADER}
1795374500,4,POST,/v1/classify,0.000000,0.000000,{NA},0,0,0,0.0,0,0,0
1795374500,4,,Aggregated,0.000000,0.000000,{NA},0,0,0,0.0,0,0,0
1795374501,8,POST,/v1/classify,40.000000,0.000000,12,14,16,18,25,40,60,90,200,210,210,40,0,12,15.0,3,210,60
1795374501,8,,Aggregated,45.000000,0.000000,14,18,22,30,200,310,500,700,900,900,900,45,0,14,60.0,2,900,98
1795374502,8,POST,/v1/classify,55.000000,1.000000,13,15,17,19,26,42,61,95,200,210,210,95,1,12,15.2,3,210,60
1795374502,8,,Aggregated,70.500000,1.500000,15,19,23,31,210,320,510,720,900,900,900,116,2,14,60.0,2,900,98
"""


def write_csvs(folder: Path, history: bool = True) -> Path:
    prefix = folder / "locust"
    Path(f"{prefix}_stats.csv").write_text(STATS)
    Path(f"{prefix}_failures.csv").write_text(FAILURES)
    if history:
        Path(f"{prefix}_stats_history.csv").write_text(HISTORY)
    return prefix


def test_the_report_separates_429s_from_other_failures(tmp_path: Path) -> None:
    report = write_report(write_csvs(tmp_path), run={"users": "8"})
    classify, bad, stream, first_token, total = report.endpoints
    assert (classify.name, classify.too_many, classify.other_failures) == ("/v1/classify", 28, 2)
    assert (stream.too_many, stream.other_failures) == (2, 0)
    assert bad.failures == 0 and first_token.method == "SSE"
    assert (total.name, total.requests, total.too_many, report.unexpected_failures) == (
        "Aggregated",
        1448,
        30,
        2,
    )

    markdown = report.markdown.read_text()
    assert "- users: 8" in markdown
    assert "| POST | `/v1/classify` | 1000 | 50.00 | 12 | 40 | 90 | 210 | 2 | 2.8 % |" in markdown
    assert (
        "| SSE | `/v1/generate [stream] first token` | 198 | 9.90 | 20 | 45 | 80 | 90 | 0 | 0.0 % |"
        in markdown
    )
    assert "|  | **all** | 1448 | 72.40 | 14 | 310 | 700 | 900 | 2 | 2.1 % |" in markdown
    assert "other failures: **2**" in markdown
    assert '500 (expected 200): {"error": "boom"} | 2 |' in markdown  # the failures table, worst first
    for chart in ("latency.png", "throughput.png"):
        assert (tmp_path / chart).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
        assert f"![{chart[:-4]}]({chart})" in markdown


def test_history_skips_percentiles_before_the_first_request(tmp_path: Path) -> None:
    history = read_history(write_csvs(tmp_path))
    assert set(history) == {"Aggregated", "POST /v1/classify"}
    first, second, third = history["Aggregated"]
    assert first.p95 is None and second.p95 == 310 and third.rps == 70.5 and third.users == 8


def test_no_history_no_charts_and_the_cli(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    prefix = write_csvs(tmp_path, history=False)
    assert main([str(prefix), "--out", str(tmp_path / "out")]) == 0
    assert "# Load test report" in capsys.readouterr().out
    assert not (tmp_path / "out" / "latency.png").exists()
    assert "## Over time" not in (tmp_path / "out" / "report.md").read_text()


def test_the_final_totals_win_over_the_lagging_csv(tmp_path: Path) -> None:
    prefix = write_csvs(tmp_path)
    final = STATS.replace(",Aggregated,1448,32,", ",Aggregated,1460,33,")
    Path(f"{prefix}_final_stats.csv").write_text(final)
    Path(f"{prefix}_final_failures.csv").write_text(FAILURES.replace(",28,", ",29,"))
    report = write_report(prefix)
    assert (report.total.requests, report.total.failures, report.total.too_many) == (1460, 33, 31)
