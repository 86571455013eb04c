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


def token_ids(encoder: TextEncoder, text: str) -> list[int]:
    return [int(t) for t in encoder.encode([text])[0].input_ids]


def streamed(encoder: TextEncoder, ids: list[int]) -> list[str | None]:
    stream = encoder.text_stream()
    return [stream.step(token) for token in ids]


def test_a_text_stream_spells_the_decoded_text_and_holds_back_split_characters(tiny_repository: Path) -> None:
    encoder = encoder_of(tiny_repository, "tiny-lm")  # byte-level BPE: characters split across tokens
    ids = token_ids(encoder, "Acme café — 日本の映画 🎬 was founded in 1950.")
    pieces = streamed(encoder, ids)
    assert "".join(p or "" for p in pieces) == encoder.decode(ids)
    assert None in pieces  # a token that ends mid-character gives nothing until the character is whole
    assert not any("\ufffd" in (p or "") for p in pieces)


def test_a_text_stream_matches_wordpiece_decoding(tiny_repository: Path) -> None:
    encoder = encoder_of(tiny_repository, "tiny-cls")
    ids = token_ids(encoder, "I loved this film, it was wonderful. Who founded Acme?")
    assert "".join(p or "" for p in streamed(encoder, ids)) == encoder.decode(ids)


def test_a_text_stream_falls_back_to_whole_decoding_when_the_incremental_decoder_fails(
    tiny_repository: Path,
) -> None:
    class Refuses:
        def step(self, tokenizer: object, token_id: int) -> str | None:
            raise Exception("invalid prefix")  # what tokenizers raises when it cannot extend its prefix

    encoder = encoder_of(tiny_repository, "tiny-lm")
    ids = token_ids(encoder, "Acme café — 日本 was founded in 1950.")
    stream = encoder.text_stream()
    half = len(ids) // 2
    first = [stream.step(token) for token in ids[:half]]
    stream._stream = Refuses()
    rest = [stream.step(token) for token in ids[half:]]
    assert "".join(p or "" for p in first + rest) == encoder.decode(ids)
