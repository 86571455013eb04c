"""Text generation: byte-level BPE, eos-joined blocks, perplexity by hand, and LM/KD losses that fall."""

from __future__ import annotations

import itertools
import math
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
import torch.nn as nn
from tokenizers import Tokenizer
from transformers import AutoTokenizer, GPT2TokenizerFast, PretrainedConfig

from training import generation
from training.data.types import TextData
from training.models import load_teacher, make_student
from training.recipes import DistillConfig, TrainConfig
from training.tokenizer import END_OF_TEXT, save_tokenizer, special_token_ids, train_byte_bpe
from training.trainer import train

LINES = [
    "The film was wonderful and I loved every minute of it.",
    "The movie was dull and I hated every minute of it.",
    "The farmer walked to the market in the morning.",
    "It was late when the old dog reached the park.",
] * 6
DATA = TextData(lines=LINES, source="memory")
CONFIG = PretrainedConfig()  # text-generation batches do not depend on the model's config


@pytest.fixture(scope="module")
def tokenizer() -> GPT2TokenizerFast:
    return train_byte_bpe(LINES, vocab_size=300)


def test_byte_bpe_round_trips_through_tokenizer_json(tokenizer: GPT2TokenizerFast, tmp_path: Path) -> None:
    assert tokenizer.eos_token == tokenizer.bos_token == tokenizer.pad_token == END_OF_TEXT
    assert special_token_ids(tokenizer) == {"pad_token_id": 0, "bos_token_id": 0, "eos_token_id": 0}
    text = "The film was unseen-words 42, Café!"
    encoded = tokenizer(text)
    assert set(encoded) == {"input_ids", "attention_mask"}  # no token_type_ids: generate() would use them
    assert tokenizer.decode(encoded["input_ids"]) == text  # byte-level: nothing is unknown
    assert tokenizer.eos_token_id not in encoded["input_ids"]  # no template adds tokens to a prompt

    save_tokenizer(tokenizer, tmp_path)
    assert Tokenizer.from_file(str(tmp_path / "tokenizer.json")).encode(text).ids == encoded["input_ids"]
    reloaded = AutoTokenizer.from_pretrained(tmp_path)
    assert reloaded.is_fast and reloaded(text)["input_ids"] == encoded["input_ids"]
    assert reloaded.model_input_names == ["input_ids", "attention_mask"]


def test_blocks_join_lines_with_eos_and_ignore_padding(tokenizer: GPT2TokenizerFast) -> None:
    data = TextData(LINES[:2], "memory")
    blocks = generation.blocks(data, tokenizer, max_length=16)
    stream = [t for line in LINES[:2] for t in tokenizer(line)["input_ids"] + [tokenizer.eos_token_id]]
    real = blocks["attention_mask"].bool()
    assert blocks["input_ids"][real].tolist() == stream
    assert blocks["labels"][real].tolist() == stream and (blocks["labels"][~real] == -100).all()


class _Bigram(nn.Module):
    """A toy LM whose next-token logits depend on the current token only, so NLL is easy by hand."""

    def __init__(self, vocab_size: int) -> None:
        super().__init__()
        self.table = nn.Embedding(vocab_size, vocab_size)
        self.config = CONFIG

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> SimpleNamespace:
        return SimpleNamespace(logits=self.table(input_ids))


def test_perplexity_is_exp_of_the_mean_next_token_nll(tokenizer: GPT2TokenizerFast) -> None:
    torch.manual_seed(0)
    model = _Bigram(len(tokenizer))
    data = TextData(LINES[:3], "memory")
    block = 8
    stream = [t for line in data.lines for t in tokenizer(line)["input_ids"] + [tokenizer.eos_token_id]]
    table = model.table.weight.tolist()
    nll = []
    for start in range(0, len(stream), block):  # each block predicts its own next tokens, never across
        chunk = stream[start : start + block]
        for current, following in itertools.pairwise(chunk):
            row = table[current]
            nll.append(math.log(sum(math.exp(x) for x in row)) - row[following])
    expected = math.exp(sum(nll) / len(nll))

    scores = generation.evaluate(model, data, tokenizer, max_length=block, batch_size=3)  # type: ignore[arg-type]
    assert scores["perplexity"] == pytest.approx(expected, rel=1e-5)
    assert scores["nll"] == pytest.approx(sum(nll) / len(nll), rel=1e-5)


def test_uniform_model_has_the_vocabulary_size_as_perplexity(tokenizer: GPT2TokenizerFast) -> None:
    model = _Bigram(len(tokenizer))
    nn.init.zeros_(model.table.weight)
    scores = generation.evaluate(model, DATA, tokenizer, max_length=16)  # type: ignore[arg-type]
    assert scores["perplexity"] == pytest.approx(len(tokenizer), rel=1e-5)


def test_lm_and_distillation_losses_fall(tokenizer: GPT2TokenizerFast) -> None:
    torch.manual_seed(0)
    teacher = load_teacher(
        "gpt2-tiny",
        "text-generation",
        tokenizer_vocab_size=len(tokenizer),
        token_ids=special_token_ids(tokenizer),
    )
    loader = generation.make_loader(DATA, tokenizer, CONFIG, batch_size=4, max_length=32, shuffle=True)
    cfg = TrainConfig(epochs=6, lr=3e-3, batch_size=4, warmup_ratio=0.0)
    history = train(teacher, loader, generation.teacher_step, cfg, description="test")
    losses = [s["loss"] for s in history.steps]
    assert sum(losses[-3:]) < 0.6 * sum(losses[:3])

    student = make_student(teacher, num_layers=1)
    step = generation.distill_step(DistillConfig(layers=1, temperature=1.0))
    history = train(student, loader, step, cfg, teacher=teacher, description="test")
    losses = [s["loss"] for s in history.steps]
    assert sum(losses[-3:]) < 0.8 * sum(losses[:3])
    assert generation.evaluate(teacher, DATA, tokenizer, max_length=32)["perplexity"] < len(tokenizer)
    assert generation.agreement(teacher, teacher, DATA, tokenizer, max_length=32) == 1.0
