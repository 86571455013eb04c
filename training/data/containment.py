"""Which texts lie word for word inside which others: what a split of phrase-level data must respect.

SST-2's training rows are phrases cut from the same sentences ("a good movie" and "good" are rows of their
own), so an eval row can sit whole inside a training row. Texts are compared as lowercased word sequences
(runs of whitespace collapsed), and "inside" means as a run of whole words.

Every text lies inside at least one *maximal* text (one inside no other); checking a text against the
maximal ones, found through an index of their words, is enough: whatever contains it lies inside a
maximal text that then contains it too. Texts are visited longest first, so a text's containers are all
indexed before it is. A text is looked up by its rarest word, which keeps the candidates few: ~67k SST-2
rows take seconds on one core.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Sequence


def words_of(text: str) -> str:
    """The text as a space-padded lowercase word sequence: `a in b` is then a whole-word containment test."""
    return " " + " ".join(text.lower().split()) + " "


class WordIndex:
    """Texts indexed by word; finds which of them contain a text (looked up by its rarest word)."""

    def __init__(self, word_counts: Counter[str]) -> None:
        self._counts = word_counts  # how common each word is: the rarest word has the fewest candidates
        self._texts: list[str] = []
        self._by_word: dict[str, list[int]] = {}

    def containing(self, padded: str) -> list[int]:
        """Ids of the indexed texts that contain `padded` (a `words_of` result)."""
        words = padded.split()
        if not words:  # an empty text lies inside every text; no word finds them
            return list(range(len(self._texts)))
        rarest = min(words, key=lambda w: self._counts.get(w, 0))
        return [i for i in self._by_word.get(rarest, ()) if padded in self._texts[i]]

    def add(self, padded: str) -> int:
        """Index `padded`; returns its id."""
        index = len(self._texts)
        self._texts.append(padded)
        for word in set(padded.split()):
            self._by_word.setdefault(word, []).append(index)
        return index


def maximal_containers(texts: Sequence[str]) -> list[tuple[int, ...]]:
    """For each text, the ids of the maximal texts it lies inside (a maximal text: only its own id).

    Equal texts get equal answers; two texts with a common maximal container belong to one sentence.
    """
    unique = sorted({words_of(t) for t in texts}, key=len, reverse=True)
    maximal = WordIndex(_word_counts(unique))
    found: dict[str, tuple[int, ...]] = {}
    for padded in unique:  # longest first: every container of a text is indexed before it
        inside = maximal.containing(padded)
        found[padded] = tuple(inside) if inside else (maximal.add(padded),)
    return [found[words_of(t)] for t in texts]


def count_inside(inner: Iterable[str], outer: Sequence[str]) -> int:
    """How many `inner` texts lie word for word inside (or equal) some `outer` text: the leak of a split."""
    unique = sorted({words_of(t) for t in outer}, key=len, reverse=True)
    maximal = WordIndex(_word_counts(unique))
    for padded in unique:
        if not maximal.containing(padded):
            maximal.add(padded)
    return sum(1 for text in inner if maximal.containing(words_of(text)))


def containing_any(texts: Sequence[str], inner: Iterable[str]) -> set[int]:
    """Indices of `texts` that contain (or equal) some `inner` text: the rows to leave out of training."""
    padded = [words_of(t) for t in texts]
    index = WordIndex(_word_counts(padded))
    for text in padded:  # ids are row numbers: one id per row, in order
        index.add(text)
    return {row for text in inner for row in index.containing(words_of(text))}


def _word_counts(padded_texts: Iterable[str]) -> Counter[str]:
    """In how many texts each word occurs."""
    counts: Counter[str] = Counter()
    for padded in padded_texts:
        counts.update(set(padded.split()))
    return counts
