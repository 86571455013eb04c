"""Request texts of mixed lengths, like real traffic (shared by the locust scenarios and the benchmarks)."""

from __future__ import annotations

import random
from pathlib import Path

OPENINGS = ["I loved this film", "A dull, terrible film", "The acting was superb", "What a waste of time"]
MIDDLES = [", and the music was", ", although the plot was", ". The ending felt", "; the cast seemed"]
ENDINGS = [" wonderful.", " boring.", " brilliant and moving.", " painfully slow and predictable."]
CONTEXT = (
    "Acme Corporation was founded by Ada Smith in 1950 in the city of Springfield. It makes anvils and "
    "rockets, and its headquarters stand beside the old river harbour. In 1972 the company moved its "
    "factory to Shelbyville, where it employs four hundred people."
)
QUESTIONS = ["Who founded Acme?", "When was Acme founded?", "Where is the factory?", "What does Acme make?"]


def review(rng: random.Random, max_clauses: int = 3) -> str:
    """One to `max_clauses` + 1 clauses: a few tokens to a few dozen."""
    parts = [rng.choice(OPENINGS)]
    for _ in range(rng.randint(0, max_clauses)):
        parts.append(rng.choice(MIDDLES) + rng.choice(ENDINGS))
    return "".join(parts)


def reviews(count: int, seed: int = 0, max_clauses: int = 3) -> list[str]:
    rng = random.Random(seed)
    return [review(rng, max_clauses) for _ in range(count)]


def openings(path: Path, count: int, words: int = 40, seed: int = 0) -> list[str]:
    """The first `words` words of `count` paragraphs of a text file (its lines of 200 characters or more:
    WikiText's paragraphs, not its headings), drawn at random: prompts in a corpus's own style."""
    with path.open(encoding="utf-8") as lines:
        paragraphs = [line.split() for line in lines if len(line.strip()) >= 200]
    if len(paragraphs) < count:
        raise ValueError(f"{path}: {len(paragraphs)} paragraphs of 200 characters or more, {count} asked")
    return [" ".join(p[:words]) for p in random.Random(seed).sample(paragraphs, count)]
