"""The text encoder: one text alone (the fast path) encodes exactly as inside a batch."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from service.repository import read_version
from service.tokenization import TextEncoder


def encoder_of(repository: Path, name: str) -> TextEncoder:
    version = read_version(repository / name / "1")
    return TextEncoder(version.file(version.manifest.tokenizer.file), version.manifest.tokenizer)


def test_one_text_encodes_as_in_a_batch(tiny_repository: Path) -> None:
    encoder = encoder_of(tiny_repository, "tiny-cls")
    texts = ["I loved this film, it was wonderful", "A dull, terrible film. " * 40]
    together = encoder.encode(texts)
    for text, batched in zip(texts, together, strict=True):
        (alone,) = encoder.encode([text])
        np.testing.assert_array_equal(alone.input_ids, batched.input_ids)
        np.testing.assert_array_equal(alone.type_ids, batched.type_ids)
        assert alone.offsets == batched.offsets
        assert alone.truncated == batched.truncated
    assert together[1].truncated and len(together[1]) == encoder.max_length


def test_one_pair_encodes_as_in_a_batch(tiny_repository: Path) -> None:
    encoder = encoder_of(tiny_repository, "tiny-qa")
    pairs = [("When was the city founded?", "The city was founded in 1802."), ("Who?", "Nobody knows.")]
    together = encoder.encode_pairs(pairs)
    for pair, batched in zip(pairs, together, strict=True):
        (alone,) = encoder.encode_pairs([pair])
        np.testing.assert_array_equal(alone.input_ids, batched.input_ids)
        np.testing.assert_array_equal(alone.type_ids, batched.type_ids)
        assert alone.sequence_ids == batched.sequence_ids
