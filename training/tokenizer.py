"""Tokenizers trained on the run's own texts, for teachers trained from scratch: BERT WordPiece, GPT-2 BPE.

There is no model hub to download a vocabulary from, so from-scratch teachers get one learnt from the
training data. Each is built with `tokenizers` and wrapped as an HF fast tokenizer, so `save_pretrained`
writes a `tokenizer.json` that the service loads with `tokenizers` alone and gets the very same ids.

Known limit: the `tokenizers` WordPiece trainer is not deterministic (huggingface/tokenizers#1794: `##`
pieces get ids in hash-map order, which breaks ties between merges), so two runs on the same texts may
learn slightly different vocabularies. Everything after it is seeded; the saved tokenizer.json is the record.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from pathlib import Path

from tokenizers import Tokenizer, decoders, models, normalizers, pre_tokenizers, processors, trainers
from transformers import (
    BertTokenizerFast,
    GPT2TokenizerFast,
    PreTrainedTokenizerBase,
    PreTrainedTokenizerFast,
)

# Order fixes the ids: [PAD]=0 (BertConfig's pad_token_id), [UNK]=1, [CLS]=2, [SEP]=3, [MASK]=4.
SPECIAL_TOKENS = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]
# GPT-2's only special token (id 0 here): it ends each text and doubles as bos and pad.
END_OF_TEXT = "<|endoftext|>"


def train_wordpiece(
    texts: Iterable[str], vocab_size: int = 4000, lowercase: bool = True
) -> BertTokenizerFast:
    """Learn a WordPiece vocabulary (at most `vocab_size` entries) with BERT's normaliser and templates."""
    tokenizer = Tokenizer(models.WordPiece(unk_token="[UNK]", max_input_chars_per_word=100))
    tokenizer.normalizer = _bert_normalizer(lowercase)
    tokenizer.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    trainer = trainers.WordPieceTrainer(
        vocab_size=vocab_size,
        special_tokens=SPECIAL_TOKENS,
        continuing_subword_prefix="##",
        show_progress=False,
    )
    tokenizer.train_from_iterator(texts, trainer=trainer)
    learnt = tokenizer.get_vocab()
    return wordpiece_tokenizer(sorted(learnt, key=learnt.__getitem__), lowercase)


def wordpiece_tokenizer(vocabulary: list[str], lowercase: bool = True) -> BertTokenizerFast:
    """BERT's WordPiece tokenizer over a given vocabulary (ids in its order; the special tokens first):
    what `train_wordpiece` learns, or a fixed vocabulary where the same ids are needed on every run."""
    for token_id, token in enumerate(SPECIAL_TOKENS):
        assert vocabulary[token_id] == token, f"{token} must have id {token_id}"
    vocab = {token: i for i, token in enumerate(vocabulary)}
    model = models.WordPiece(
        vocab, unk_token="[UNK]", max_input_chars_per_word=100, continuing_subword_prefix="##"
    )
    tokenizer = Tokenizer(model)
    tokenizer.normalizer = _bert_normalizer(lowercase)
    tokenizer.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    tokenizer.post_processor = processors.BertProcessing(
        sep=("[SEP]", SPECIAL_TOKENS.index("[SEP]")), cls=("[CLS]", SPECIAL_TOKENS.index("[CLS]"))
    )
    tokenizer.decoder = decoders.WordPiece(prefix="##")
    return BertTokenizerFast(
        tokenizer_object=tokenizer,
        do_lower_case=lowercase,
        strip_accents=None,
        tokenize_chinese_chars=True,
        unk_token="[UNK]",
        sep_token="[SEP]",
        pad_token="[PAD]",
        cls_token="[CLS]",
        mask_token="[MASK]",
    )


def _bert_normalizer(lowercase: bool) -> normalizers.Normalizer:
    return normalizers.BertNormalizer(
        clean_text=True, handle_chinese_chars=True, strip_accents=None, lowercase=lowercase
    )


def train_byte_bpe(texts: Iterable[str], vocab_size: int = 4000) -> GPT2TokenizerFast:
    """Learn a GPT-2 style byte-level BPE (at most `vocab_size` entries): any text encodes, none is unknown.

    No template adds tokens: a prompt encodes to exactly its own pieces, and data loaders place the
    `<|endoftext|>` separators themselves. Only input_ids and attention_mask are model inputs: a GPT-2
    tokenizer that also returned token_type_ids would have generate() feed them to the model.
    """
    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=[END_OF_TEXT],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tokenizer.train_from_iterator(texts, trainer=trainer)
    assert tokenizer.token_to_id(END_OF_TEXT) == 0, f"{END_OF_TEXT} must have id 0"
    tokenizer.post_processor = processors.ByteLevel(trim_offsets=False)
    return GPT2TokenizerFast(
        tokenizer_object=tokenizer,
        bos_token=END_OF_TEXT,
        eos_token=END_OF_TEXT,
        unk_token=END_OF_TEXT,
        pad_token=END_OF_TEXT,
        add_prefix_space=False,
        model_input_names=["input_ids", "attention_mask"],
    )


# A from-scratch run trains the tokenizer its preset's family expects (models.preset_family).
TRAINERS: dict[str, Callable[[Iterable[str], int], PreTrainedTokenizerFast]] = {
    "bert": train_wordpiece,
    "gpt2": train_byte_bpe,
}


def special_token_ids(tokenizer: PreTrainedTokenizerBase) -> dict[str, int]:
    """The pad/bos/eos ids a model config must agree on with its tokenizer (those the tokenizer has)."""
    ids = {
        "pad_token_id": tokenizer.pad_token_id,
        "bos_token_id": tokenizer.bos_token_id,
        "eos_token_id": tokenizer.eos_token_id,
    }
    return {name: int(value) for name, value in ids.items() if isinstance(value, int)}


def save_tokenizer(tokenizer: PreTrainedTokenizerFast, out_dir: str | Path) -> None:
    """`save_pretrained`, with the padding/truncation state that HF calls leave behind cleared first.

    Encoding with `padding=`/`truncation=` switches those on inside the backend tokenizer and they would be
    written into tokenizer.json; the service decides both itself, from the manifest.
    """
    backend = tokenizer.backend_tokenizer
    backend.no_padding()
    backend.no_truncation()
    tokenizer.save_pretrained(str(out_dir))
