"""The trained WordPiece tokenizer survives the trip through tokenizer.json with identical ids."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from tokenizers import Tokenizer
from transformers import AutoTokenizer, BertTokenizerFast

from training.tokenizer import SPECIAL_TOKENS, save_tokenizer, train_wordpiece

TEXTS = [
    "I loved this film, it was wonderful!",
    "A dull, terrible film. I hated every minute of it.",
    "The restaurant was lovely and the staff were charming.",
    "What a boring, lifeless album...",
] * 20
PROBES = ["I LOVED this wonderful film!!", "zzz qqq unseen-words 42", "Café naïve, déjà vu", ""]
PAIRS = [("Who hated it?", "A dull film. I hated every minute of it."), ("lovely", "terrible")]


@pytest.fixture(scope="module")
def saved(tmp_path_factory: pytest.TempPathFactory) -> tuple[BertTokenizerFast, Path]:
    tokenizer = train_wordpiece(TEXTS, vocab_size=300)
    tokenizer("warm up the HF padding/truncation state", padding="max_length", truncation=True, max_length=16)
    out = tmp_path_factory.mktemp("tok")
    save_tokenizer(tokenizer, out)
    return tokenizer, out


def test_special_tokens_have_bert_ids(saved: tuple[BertTokenizerFast, Path]) -> None:
    tokenizer, _ = saved
    assert [tokenizer.convert_tokens_to_ids(t) for t in SPECIAL_TOKENS] == [0, 1, 2, 3, 4]
    assert tokenizer.pad_token_id == 0
    assert len(tokenizer) <= 300
    ids = tokenizer("lovely film")["input_ids"]
    assert ids[0] == tokenizer.cls_token_id and ids[-1] == tokenizer.sep_token_id


def test_tokenizer_json_gives_the_same_ids(saved: tuple[BertTokenizerFast, Path]) -> None:
    tokenizer, out = saved
    raw = Tokenizer.from_file(str(out / "tokenizer.json"))
    for text in PROBES + TEXTS[:4]:
        hf = tokenizer(text)
        enc = raw.encode(text)
        assert enc.ids == hf["input_ids"], text
        assert enc.attention_mask == hf["attention_mask"]


def test_pairs_round_trip_with_segment_ids(saved: tuple[BertTokenizerFast, Path]) -> None:
    tokenizer, out = saved
    raw = Tokenizer.from_file(str(out / "tokenizer.json"))
    for first, second in PAIRS:
        hf = tokenizer(first, second)
        enc = raw.encode(first, second)
        assert enc.ids == hf["input_ids"]
        assert enc.type_ids == hf["token_type_ids"]
        assert set(enc.type_ids) == {0, 1}
        assert enc.ids.count(tokenizer.sep_token_id) == 2


def test_saved_file_has_no_leftover_padding_or_truncation(saved: tuple[BertTokenizerFast, Path]) -> None:
    _, out = saved
    spec = json.loads((out / "tokenizer.json").read_text())
    assert spec["padding"] is None and spec["truncation"] is None


def test_auto_tokenizer_reloads_identically(saved: tuple[BertTokenizerFast, Path]) -> None:
    tokenizer, out = saved
    reloaded = AutoTokenizer.from_pretrained(out)
    assert reloaded.is_fast
    for text in PROBES:
        assert reloaded(text)["input_ids"] == tokenizer(text)["input_ids"]


def test_casing_is_kept_when_asked() -> None:
    cased = train_wordpiece(["Hello hello HELLO"] * 10, vocab_size=100, lowercase=False)
    assert cased("Hello")["input_ids"] != cased("hello")["input_ids"]
