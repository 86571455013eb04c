"""benchmarks.cascade's report: what it says of the pair's cost, from the student's manifest."""

from __future__ import annotations

from benchmarks.cascade import cost_line


def test_the_report_says_when_the_calibrated_cascade_skips_the_student() -> None:
    dearer = cost_line({"student_cost": 0.51, "fallback_rate": 0.836})
    assert "0.51 + 83.6 % sent = 1.35 teacher passes" in dearer and "skips the student" in dearer
    cheaper = cost_line({"student_cost": 0.51, "fallback_rate": 0.179})
    assert "= 0.69 teacher passes" in cheaper and "skips" not in cheaper
    assert "did not time" in cost_line({"fallback_rate": 0.2})
    limit = {"threshold": 0.3454, "agreement": 0.854, "fallback_rate": 0.469}
    paying = cost_line({"student_cost": 0.53, "fallback_rate": 0.788, "paying_limit": limit})
    assert "at most 85.40 % agreement (threshold 0.3454, 46.9 % sent)" in paying
