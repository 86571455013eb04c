"""benchmarks.rerank's rankers as the command line names them."""

from __future__ import annotations

from benchmarks.rerank import ranker_spec


def test_a_ranker_is_served_as_it_is_or_with_a_requests_margin() -> None:
    assert ranker_spec("ranker") == ("ranker", None)  # a pair's student: its calibrated cascade
    assert ranker_spec("ranker:0") == ("ranker", 0.0)  # the student alone
    assert ranker_spec("ranker-teacher:1.5") == ("ranker-teacher", 1.5)
