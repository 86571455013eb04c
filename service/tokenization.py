"""Text -> token ids with `tokenizers` (never `transformers`), and padding a batch to its longest row."""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass
from functools import cache
from pathlib import Path

import numpy as np
from tokenizers import Encoding, Tokenizer
from tokenizers.decoders import ByteLevel, DecodeStream

from service.manifest import TokenizerSpec


@dataclass(frozen=True)
class EncodedText:
    """One sequence, unpadded. `offsets` map tokens back to characters of the text they came from."""

    input_ids: np.ndarray
    type_ids: np.ndarray
    offsets: list[tuple[int, int]]
    truncated: bool
    sequence_ids: tuple[int | None, ...] = ()  # per token: 0 first text, 1 second text, None special

    def __len__(self) -> int:
        return int(self.input_ids.shape[0])


@dataclass(frozen=True)
class Token:
    """One token of a text as TEI's /tokenize shows it: where it stands in the text (characters), or, for a
    special token, nowhere."""

    id: int
    text: str
    special: bool
    start: int | None
    stop: int | None


class TextStream:
    """The text a growing sequence of generated tokens spells, handed out piece by piece.

    tokenizers' DecodeStream decodes a few tokens' window per step, where decoding the whole output at every
    token cost O(n) per token (64 tokens: 6.6 us a token; 512: 75 us). Should a decoder ever rewrite text
    it already gave out (DecodeStream then raises), this stream falls back to decoding everything so far.
    """

    def __init__(self, tokenizer: Tokenizer, skip_special_tokens: bool = True) -> None:
        self._tokenizer = tokenizer
        self._skip_special_tokens = skip_special_tokens
        self._stream: DecodeStream | None = DecodeStream(skip_special_tokens=skip_special_tokens)
        self._ids: list[int] = []
        self._emitted = 0  # characters handed out

    def step(self, token_id: int) -> str | None:
        """The text this token completes; None while it ends mid-character (the rest comes later)."""
        self._ids.append(token_id)
        if self._stream is not None:
            try:
                piece = self._stream.step(self._tokenizer, token_id)
            except Exception:  # tokenizers raises a plain Exception for a prefix it cannot extend
                self._stream = None
            else:
                self._emitted += len(piece or "")
                return piece
        text = self._tokenizer.decode(self._ids, skip_special_tokens=self._skip_special_tokens)
        if text.endswith("\ufffd"):
            return None
        piece, self._emitted = text[self._emitted :], len(text)
        return piece


class TextEncoder:
    """The manifest's tokenizer with its truncation settings; padding happens per batch, not here."""

    def __init__(self, path: Path, spec: TokenizerSpec) -> None:
        self._tokenizer = Tokenizer.from_file(str(path))
        self._tokenizer.no_padding()
        self.max_length = spec.max_length
        if spec.truncation:
            self._tokenizer.enable_truncation(spec.max_length)
        else:
            self._tokenizer.no_truncation()
        self.pad_token_id = spec.pad_token_id
        self._whole: Tokenizer | None = None  # copies with other truncation, made when first needed
        self._windows: Tokenizer | None = None
        self._windows_stride = -1

    def encode(self, texts: Sequence[str]) -> list[EncodedText]:
        if len(texts) == 1:  # encode_batch hands even one text to its thread pool: a wake-up per request
            return [self._convert(self._tokenizer.encode(texts[0]))]
        return [self._convert(e) for e in self._tokenizer.encode_batch(list(texts))]

    def encode_pairs(self, pairs: Sequence[tuple[str, str]]) -> list[EncodedText]:
        if len(pairs) == 1:
            return [self._convert(self._tokenizer.encode(*pairs[0]))]
        return [self._convert(e) for e in self._tokenizer.encode_batch(list(pairs))]

    def encode_untruncated(self, text: str, add_special_tokens: bool = True) -> EncodedText:
        """Every token of the text (a prompt may be cut from the left, which truncation cannot do).
        `add_special_tokens=False` for text that already holds them (a rendered chat template)."""
        return self._convert(self._untruncated().encode(text, add_special_tokens=add_special_tokens))

    def context_room(self, question: str) -> int:
        """Tokens left for the context beside this question and the special tokens (may be <= 0)."""
        question_tokens = len(self._untruncated().encode(question, add_special_tokens=False).ids)
        post_processor = self._tokenizer.post_processor
        special = post_processor.num_special_tokens_to_add(True) if post_processor else 0
        return self.max_length - question_tokens - special

    def encode_windows(self, question: str, context: str, stride: int) -> list[EncodedText]:
        """Question + context, the context split into windows of `max_length` tokens, each overlapping the
        last by `stride` tokens; `stride` must be below `context_room(question)` (tokenizers would panic)."""
        if self._windows is None:
            self._windows = Tokenizer.from_str(self._tokenizer.to_str())
            self._windows.no_padding()
        if self._windows_stride != stride:  # one copy, re-set when the stride changes (the loop's only)
            self._windows.enable_truncation(self.max_length, stride=stride, strategy="only_second")
            self._windows_stride = stride
        first = self._windows.encode(question, context)
        return [self._convert(e) for e in (first, *first.overflowing)]

    def _untruncated(self) -> Tokenizer:
        if self._whole is None:
            self._whole = Tokenizer.from_str(self._tokenizer.to_str())
            self._whole.no_padding()
            self._whole.no_truncation()
        return self._whole

    def tokens(self, text: str, add_special_tokens: bool = True) -> list[Token]:
        """Every token of `text` (no truncation), each with its piece of the text."""
        e = self._untruncated().encode(text, add_special_tokens=add_special_tokens)
        return [
            Token(token_id, piece, True, None, None)
            if special
            else Token(token_id, text[start:stop], False, start, stop)
            for token_id, piece, (start, stop), special in zip(
                e.ids, e.tokens, e.offsets, e.special_tokens_mask, strict=True
            )
        ]

    @property
    def vocab_size(self) -> int:
        """Ids below this name a token (added tokens included)."""
        return int(self._tokenizer.get_vocab_size(with_added_tokens=True))

    def id_to_token(self, token_id: int) -> str | None:
        return self._tokenizer.id_to_token(token_id)

    def token_to_id(self, token: str) -> int | None:
        return self._tokenizer.token_to_id(token)

    def decode(self, ids: Sequence[int], skip_special_tokens: bool = True) -> str:
        return self._tokenizer.decode(list(ids), skip_special_tokens=skip_special_tokens)

    def token_bytes(self, token_id: int) -> bytes:
        """The bytes one token stands for (what OpenAI's logprobs report: a token may be part of a
        character). Byte-level BPE (GPT-2, Llama 3, SmolLM2) maps each byte to a printable stand-in;
        SentencePiece writes a space as '▁' and a lone byte as '<0xNN>'."""
        piece = self._tokenizer.id_to_token(token_id)
        if piece is None:
            return b""
        if isinstance(self._tokenizer.decoder, ByteLevel):
            byte_of = _byte_level_bytes()
            if all(char in byte_of for char in piece):  # an added token ('<|im_end|>') may use any text
                return bytes(byte_of[char] for char in piece)
        if match := _LONE_BYTE.fullmatch(piece):
            return bytes([int(match.group(1), 16)])
        return piece.replace("▁", " ").encode()

    def text_stream(self) -> TextStream:
        """A new incremental decoder for one generated sequence."""
        return TextStream(self._tokenizer)

    @staticmethod
    def _convert(e: Encoding) -> EncodedText:
        return EncodedText(
            input_ids=np.asarray(e.ids, dtype=np.int64),
            type_ids=np.asarray(e.type_ids, dtype=np.int64),
            offsets=list(e.offsets),
            truncated=bool(e.overflowing),
            sequence_ids=tuple(e.sequence_ids),
        )


def pad_batch(rows: Sequence[EncodedText], pad_token_id: int) -> dict[str, np.ndarray]:
    """Right-pad to the batch's longest row (never to the model max): padded tokens are wasted compute."""
    longest = max(len(r) for r in rows)
    input_ids = np.full((len(rows), longest), pad_token_id, dtype=np.int64)
    attention_mask = np.zeros((len(rows), longest), dtype=np.int64)
    token_type_ids = np.zeros((len(rows), longest), dtype=np.int64)
    for i, row in enumerate(rows):
        n = len(row)
        input_ids[i, :n] = row.input_ids
        attention_mask[i, :n] = 1
        token_type_ids[i, :n] = row.type_ids
    return {"input_ids": input_ids, "attention_mask": attention_mask, "token_type_ids": token_type_ids}


_LONE_BYTE = re.compile(r"<0x([0-9A-Fa-f]{2})>")


@cache
def _byte_level_bytes() -> dict[str, int]:
    """Byte-level BPE's alphabet, stand-in -> byte: the printable Latin-1 bytes stand for themselves, the
    other 68 (controls, space, soft hyphen) for the characters from U+0100 up, in byte order (GPT-2's)."""
    printable = [
        *range(ord("!"), ord("~") + 1),
        *range(ord("¡"), ord("¬") + 1),
        *range(ord("®"), ord("ÿ") + 1),
    ]
    stand_in = {byte: byte for byte in printable}
    for byte in range(256):
        if byte not in stand_in:
            stand_in[byte] = 256 + len(stand_in) - len(printable)
    return {chr(char): byte for byte, char in stand_in.items()}
