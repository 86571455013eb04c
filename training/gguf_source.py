"""A GGUF file (llama.cpp's format) as a float32 PyTorch model and a fast tokenizer.

transformers dequantizes GGUF weights well, but its tokenizer conversion is wrong for byte-level BPE
vocabularies such as SmolLM2's (transformers 4.57): the end-of-sequence token is taken from the
beginning-of-sequence id, a BOS is prepended although the file says not to, no pad token is set, and the
digit splitting of the file's pre-tokenizer is dropped. So the tokenizer is built here from the file's own
fields (vocabulary, merges, token types, special ids, pre-tokenizer name, chat template) with `tokenizers`,
and only the weights come through transformers.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

# llama.cpp's pre-tokenizer names (tokenizer.ggml.pre) whose split rules are GPT-2's regex, without or with
# every digit split off first (llama-vocab.cpp: STARCODER, REFACT, SMOLLM, CODESHELL share "\p{N}" + GPT-2).
GPT2_SPLIT = ("gpt2", "mpt", "olmo", "jais")
DIGITS_THEN_GPT2_SPLIT = ("starcoder", "refact", "smollm", "codeshell")
CONTROL, USER_DEFINED = 3, 4  # tokenizer.ggml.token_type values of special and added tokens


@dataclass(frozen=True)
class GGUFTokenizerFields:
    """What a byte-level BPE tokenizer needs from a GGUF file."""

    tokens: list[str]
    merges: list[str]
    token_types: list[int]
    pre: str
    special_ids: dict[str, int]  # bos, eos, unk, pad: those the file names
    add_bos: bool
    chat_template: str | None


@dataclass(frozen=True)
class GGUFSummary:
    """What the file says about itself, for the import report: model, name and how it was quantized."""

    architecture: str
    name: str | None
    tensor_types: dict[str, int] = field(default_factory=dict)  # e.g. {"Q4_1": 210, "F32": 61}
    context_length: int | None = None


def _value(reader: Any, key: str, default: Any = None) -> Any:
    found = reader.fields.get(key)
    return default if found is None else found.contents()


def read_gguf(path: Path) -> tuple[GGUFSummary, GGUFTokenizerFields]:
    """The summary and tokenizer fields of a GGUF file (metadata only; no tensor is dequantized)."""
    from gguf import GGUFReader

    reader = GGUFReader(path)
    architecture = str(_value(reader, "general.architecture", "?"))
    summary = GGUFSummary(
        architecture=architecture,
        name=_value(reader, "general.name"),
        tensor_types=dict(Counter(t.tensor_type.name for t in reader.tensors)),
        context_length=_value(reader, f"{architecture}.context_length"),
    )
    model = _value(reader, "tokenizer.ggml.model")
    if model != "gpt2":
        raise ValueError(
            f"{path}: tokenizer model {model!r}; the import reads byte-level BPE "
            "(tokenizer.ggml.model 'gpt2') only: import the model's Hugging Face directory instead"
        )
    special_ids = {
        name: int(value)
        for name, key in (("bos", "bos"), ("eos", "eos"), ("unk", "unknown"), ("pad", "padding"))
        if (value := _value(reader, f"tokenizer.ggml.{key}_token_id")) is not None
    }
    fields = GGUFTokenizerFields(
        tokens=list(_value(reader, "tokenizer.ggml.tokens")),
        merges=list(_value(reader, "tokenizer.ggml.merges", [])),
        token_types=[int(t) for t in _value(reader, "tokenizer.ggml.token_type", [])],
        pre=str(_value(reader, "tokenizer.ggml.pre", "gpt2")),
        special_ids=special_ids,
        add_bos=bool(_value(reader, "tokenizer.ggml.add_bos_token", False)),
        chat_template=_value(reader, "tokenizer.chat_template"),
    )
    return summary, fields


def _pre_tokenizer(pre: str) -> Any:
    from tokenizers import pre_tokenizers

    byte_level = pre_tokenizers.ByteLevel(add_prefix_space=False, trim_offsets=True, use_regex=True)
    if pre in GPT2_SPLIT:
        return byte_level
    if pre in DIGITS_THEN_GPT2_SPLIT:
        return pre_tokenizers.Sequence([pre_tokenizers.Digits(individual_digits=True), byte_level])
    known = ", ".join(GPT2_SPLIT + DIGITS_THEN_GPT2_SPLIT)
    raise ValueError(
        f"pre-tokenizer {pre!r}: its split rules are not known here ({known}); importing it would tokenize "
        "differently from the model's training"
    )


def byte_level_tokenizer(fields: GGUFTokenizerFields, max_length: int | None) -> Any:
    """A PreTrainedTokenizerFast equal to llama.cpp's reading of the file: special tokens by the file's ids,
    control tokens never split, BOS added only if the file says so, the file's chat template."""
    from tokenizers import AddedToken, Tokenizer, decoders, models, processors
    from transformers import PreTrainedTokenizerFast

    vocab = {token: index for index, token in enumerate(fields.tokens)}
    merges = [tuple(m.split(" ", 1)) for m in fields.merges]
    tok = Tokenizer(models.BPE(vocab=vocab, merges=merges, fuse_unk=False))
    tok.pre_tokenizer = _pre_tokenizer(fields.pre)
    tok.decoder = decoders.ByteLevel()
    typed = list(zip(fields.tokens, fields.token_types or [1] * len(fields.tokens), strict=True))
    tok.add_special_tokens([AddedToken(t, special=True, normalized=False) for t, k in typed if k == CONTROL])
    tok.add_tokens([AddedToken(t, normalized=False) for t, k in typed if k == USER_DEFINED])
    named = {f"{name}_token": fields.tokens[i] for name, i in fields.special_ids.items()}
    if fields.add_bos and "bos" in fields.special_ids:
        bos = named["bos_token"]
        tok.post_processor = processors.TemplateProcessing(
            single=f"{bos} $A", pair=f"{bos} $A {bos} $B", special_tokens=[(bos, fields.special_ids["bos"])]
        )
    else:
        tok.post_processor = processors.ByteLevel(trim_offsets=False)
    extra = {"model_max_length": max_length} if max_length else {}
    return PreTrainedTokenizerFast(
        tokenizer_object=tok,
        model_input_names=["input_ids", "attention_mask"],  # no token_type_ids: they break generate()
        clean_up_tokenization_spaces=False,
        chat_template=fields.chat_template,
        **named,
        **extra,
    )


def load_gguf_model(path: Path) -> Any:
    """The file's weights dequantized into a float32 causal LM (transformers' GGUF loader)."""
    import torch
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(path.parent, gguf_file=path.name, dtype=torch.float32).eval()
