"""The text encoder: one text (or pair) alone, the fast path, encodes exactly as inside a batch."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from service.repository import read_version
from service.tokenization import EncodedText, TextEncoder


def encoder_of(repository: Path, name: str) -> TextEncoder:
    version = read_version(repository / name / "1")
    return TextEncoder(version.file(version.manifest.tokenizer.file), version.manifest.tokenizer)


def assert_same(alone: EncodedText, batched: EncodedText) -> None:
    np.testing.assert_array_equal(alone.input_ids, batched.input_ids)
    np.testing.assert_array_equal(alone.type_ids, batched.type_ids)
    assert (alone.offsets, alone.truncated, alone.sequence_ids) == (
        batched.offsets,
        batched.truncated,
        batched.sequence_ids,
    )


def test_one_text_encodes_as_in_a_batch(tiny_repository: Path) -> None:
    encoder = encoder_of(tiny_repository, "tiny-cls")
    texts = ["I loved this film, it was wonderful", "A dull, terrible film. " * 40]
    together = encoder.encode(texts)
    for text, batched in zip(texts, together, strict=True):
        assert_same(encoder.encode([text])[0], batched)
    assert together[1].truncated and len(together[1]) == encoder.max_length


def test_one_pair_encodes_as_in_a_batch(tiny_repository: Path) -> None:
    encoder = encoder_of(tiny_repository, "tiny-qa")
    pairs = [("When was the city founded?", "The city was founded in 1802."), ("Who?", "Nobody knows.")]
    for pair, batched in zip(pairs, encoder.encode_pairs(pairs), strict=True):
        assert_same(encoder.encode_pairs([pair])[0], batched)
