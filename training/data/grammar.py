"""Small helpers of the demo data's template grammars: word lists, weighted picks, articles, capitals."""

from __future__ import annotations

import random
import re
from collections.abc import Sequence

WORD = re.compile(r"[a-z]+")  # a review's words, for telling two reviews apart


def words(text: str) -> tuple[str, ...]:
    """Word lists written as one string keep the lexicons compact and easy to extend."""
    return tuple(text.split())


def phrases(text: str) -> tuple[str, ...]:
    return tuple(part.strip() for part in text.split("|"))


def pick(rng: random.Random, options: Sequence[str], weights: Sequence[float] | None = None) -> str:
    return rng.choices(options, weights=weights)[0] if weights else rng.choice(options)


def indefinite_article(word: str) -> str:
    """English indefinite article; the demo lexicons avoid words whose spelling misleads it."""
    return "an" if word[:1].lower() in "aeiou" else "a"


def cap(text: str) -> str:
    return text[:1].upper() + text[1:]
