from pathlib import Path

import pytest

from loadtests.texts import openings


def test_openings_are_the_first_words_of_paragraphs_not_headings(tmp_path: Path) -> None:
    paragraphs = [" ".join(f"w{i}_{j}" for j in range(60)) for i in range(5)]
    corpus = tmp_path / "valid.txt"
    corpus.write_text("\n".join([" = Heading = ", "", *paragraphs, " short line "]) + "\n", encoding="utf-8")
    drawn = openings(corpus, 5, words=40, seed=3)
    assert sorted(drawn) == sorted(" ".join(p.split()[:40]) for p in paragraphs)
    assert openings(corpus, 5, words=40, seed=3) == drawn  # the same draw for the same seed


def test_asking_more_openings_than_paragraphs_says_so(tmp_path: Path) -> None:
    corpus = tmp_path / "valid.txt"
    corpus.write_text("x " * 150 + "\n = Heading = \n", encoding="utf-8")
    with pytest.raises(ValueError, match="1 paragraphs of 200 characters or more, 2 asked"):
        openings(corpus, 2)
