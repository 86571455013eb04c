"""The text encoder: one text (or pair) alone, the fast path, encodes exactly as inside a batch."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from service.manifest import TokenizerSpec
from service.repository import read_version
from service.tokenization import EncodedText, TextEncoder
from tests.conftest import TASK_MODEL_NAMES


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


def test_a_byte_level_bpe_tokens_bytes_spell_the_text(tiny_repository: Path) -> None:
    from transformers.models.gpt2.tokenization_gpt2 import bytes_to_unicode

    from service.tokenization import _byte_level_bytes

    assert _byte_level_bytes() == {char: byte for byte, char in bytes_to_unicode().items()}  # GPT-2's map
    encoder = encoder_of(tiny_repository, TASK_MODEL_NAMES["text-generation"])
    text = "naïve café, 東京 — ok\n"
    ids = encoder.encode_untruncated(text, add_special_tokens=False).input_ids
    pieces = [encoder.token_bytes(int(i)) for i in ids]
    assert b"".join(pieces) == text.encode()
    assert any(len(p) == 1 and p[0] >= 0x80 for p in pieces)  # a byte alone: part of a character


def test_sentencepiece_tokens_give_spaces_and_lone_bytes(tmp_path: Path) -> None:
    from tokenizers import Tokenizer, decoders, models

    vocab = {"<unk>": 0, "▁caf": 1, "<0xC3>": 2, "<0xA9>": 3, "▁ok": 4}
    tokenizer = Tokenizer(models.BPE(vocab=vocab, merges=[], unk_token="<unk>", byte_fallback=True))
    tokenizer.decoder = decoders.Sequence(
        [decoders.Replace("▁", " "), decoders.ByteFallback(), decoders.Fuse()]
    )
    tokenizer.save(str(tmp_path / "tokenizer.json"))
    spec = TokenizerSpec(sha256="0" * 64, max_length=16, pad_token_id=0)
    encoder = TextEncoder(tmp_path / "tokenizer.json", spec)
    assert [encoder.token_bytes(i) for i in (1, 2, 3, 4)] == [b" caf", b"\xc3", b"\xa9", b" ok"]
    assert b"".join(encoder.token_bytes(i) for i in (1, 2, 3, 4)).decode() == " café ok"
