"""Fill-mask: BERT's 80/10/10 masking, fixed eval masks, and MLM/KD losses that fall on a tiny model."""

from __future__ import annotations

import pytest
import torch
from transformers import BertTokenizerFast, PretrainedConfig

from training import fill_mask
from training.data.types import TextData
from training.models import load_teacher, make_student
from training.recipes import DistillConfig, TrainConfig
from training.tokenizer import special_token_ids, train_wordpiece
from training.trainer import train

LINES = [
    "I loved this film, it was wonderful.",
    "The movie was dull and I hated every minute of it.",
    "The farmer walked to the market in the morning.",
    "What a lovely book! We read it on a rainy afternoon.",
] * 6
DATA = TextData(lines=LINES, source="memory")
CONFIG = PretrainedConfig()  # fill-mask batches do not depend on the model's config


@pytest.fixture(scope="module")
def tokenizer() -> BertTokenizerFast:
    return train_wordpiece(LINES, vocab_size=200)


def _masking_batch(tokenizer: BertTokenizerFast) -> dict[str, torch.Tensor]:
    """Many blocks of ordinary tokens framed by [CLS]/[SEP], the last 8 positions padding."""
    torch.manual_seed(0)
    ordinary = fill_mask.MaskingIds.of(tokenizer).ordinary_ids
    ids = ordinary[torch.randint(len(ordinary), (400, 64))]
    ids[:, 0], ids[:, 55] = tokenizer.cls_token_id, tokenizer.sep_token_id
    ids[:, 56:] = tokenizer.pad_token_id
    mask = torch.ones_like(ids)
    mask[:, 56:] = 0
    return {"input_ids": ids, "attention_mask": mask}


def test_masking_follows_bert_80_10_10(tokenizer: BertTokenizerFast) -> None:
    batch = _masking_batch(tokenizer)
    ids = fill_mask.MaskingIds.of(tokenizer)
    out = fill_mask.mask_tokens(batch, ids, torch.Generator().manual_seed(1))

    original, masked, labels = batch["input_ids"], out["input_ids"], out["labels"]
    chosen = labels != -100
    candidates = 400 * 54  # real tokens minus [CLS] and [SEP]
    assert chosen.sum().item() / candidates == pytest.approx(0.15, abs=0.01)
    assert torch.equal(labels[chosen], original[chosen])
    assert torch.equal(masked[~chosen], original[~chosen])  # nothing else is touched
    n = chosen.sum().item()
    to_mask = (masked[chosen] == tokenizer.mask_token_id).sum().item() / n
    kept = (masked[chosen] == original[chosen]).sum().item() / n
    swapped = 1 - to_mask - kept
    assert to_mask == pytest.approx(0.8, abs=0.03)
    assert swapped == pytest.approx(0.1, abs=0.02) and kept == pytest.approx(0.1, abs=0.02)
    swapped_ids = masked[chosen & (masked != original) & (masked != tokenizer.mask_token_id)]
    assert not torch.isin(swapped_ids, ids.special_ids).any()  # random swaps are ordinary tokens


def test_special_tokens_and_padding_are_never_masked(tokenizer: BertTokenizerFast) -> None:
    batch = _masking_batch(tokenizer)
    for seed in range(5):
        out = fill_mask.mask_tokens(
            batch, fill_mask.MaskingIds.of(tokenizer), torch.Generator().manual_seed(seed), probability=0.9
        )
        special = torch.isin(batch["input_ids"], fill_mask.MaskingIds.of(tokenizer).special_ids)
        assert (out["labels"][special] == -100).all()
        assert torch.equal(out["input_ids"][special], batch["input_ids"][special])


def test_eval_masks_are_fixed_whatever_the_batch_size(tokenizer: BertTokenizerFast) -> None:
    def masked(batch_size: int, seed: int) -> torch.Tensor:
        loader = fill_mask.make_loader(
            DATA, tokenizer, CONFIG, batch_size=batch_size, max_length=32, shuffle=False, seed=seed
        )
        return torch.cat([b["labels"] for b in loader])

    assert torch.equal(masked(4, seed=0), masked(7, seed=3))  # the eval mask ignores the run's seed
    assert (masked(4, seed=0) != -100).any()


def test_training_masks_are_seeded_and_fresh_every_epoch(tokenizer: BertTokenizerFast) -> None:
    def epochs(seed: int) -> list[torch.Tensor]:
        loader = fill_mask.make_loader(
            DATA, tokenizer, CONFIG, batch_size=4, max_length=32, shuffle=True, seed=seed
        )
        return [torch.cat([b["labels"] for b in loader]) for _ in range(2)]

    first, again = epochs(0), epochs(0)
    assert all(torch.equal(a, b) for a, b in zip(first, again, strict=True))
    assert not torch.equal(first[0], first[1])  # dynamic masking


def test_blocks_pack_framed_lines(tokenizer: BertTokenizerFast) -> None:
    blocks = fill_mask.blocks(TextData(LINES[:2], "memory"), tokenizer, max_length=16)
    stream = [t for ids in tokenizer(LINES[:2])["input_ids"] for t in ids]
    real = blocks["input_ids"][blocks["attention_mask"].bool()].tolist()
    assert real == stream and stream[0] == tokenizer.cls_token_id  # nothing lost, nothing added
    assert blocks["input_ids"].shape[1] == 16 and blocks["attention_mask"][:-1].all()  # only the last pads


def test_mlm_and_distillation_losses_fall(tokenizer: BertTokenizerFast) -> None:
    torch.manual_seed(0)
    teacher = load_teacher(
        "bert-tiny", "fill-mask", tokenizer_vocab_size=len(tokenizer), token_ids=special_token_ids(tokenizer)
    )
    loader = fill_mask.make_loader(DATA, tokenizer, teacher.config, batch_size=4, max_length=32, shuffle=True)
    cfg = TrainConfig(epochs=16, lr=5e-3, batch_size=4, warmup_ratio=0.0)
    history = train(teacher, loader, fill_mask.teacher_step, cfg, description="test")
    losses = [s["loss"] for s in history.steps]
    assert sum(losses[-4:]) < 0.7 * sum(losses[:4])

    student = make_student(teacher, num_layers=1)
    step = fill_mask.distill_step(DistillConfig(layers=1, temperature=2.0))
    history = train(student, loader, step, cfg, teacher=teacher, description="test")
    losses = [s["loss"] for s in history.steps]
    assert sum(losses[-4:]) < 0.9 * sum(losses[:4])
    scores = fill_mask.evaluate(teacher, DATA, tokenizer, max_length=32)
    assert 0.0 <= scores["accuracy"] <= 1.0 and scores["nll"] > 0
    assert fill_mask.agreement(teacher, teacher, DATA, tokenizer, max_length=32) == 1.0
