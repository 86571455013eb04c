"""Tiny untrained models of every task family, built from configs in a second (no hub here)."""

from __future__ import annotations

from pathlib import Path

CORPUS = [
    "I loved this film, it was wonderful.",
    "A dull, terrible film. I hated every minute of it.",
    "Acme was founded by John Smith in 1950 in the city of Springfield.",
    "Who founded Acme? When was it founded? Where is Springfield?",
] * 40


def _wordpiece() -> object:
    from training.tokenizer import train_wordpiece

    return train_wordpiece(CORPUS, vocab_size=300)


def _bpe() -> object:
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=400, special_tokens=["<|endoftext|>"], initial_alphabet=pre_tokenizers.ByteLevel.alphabet()
    )
    tok.train_from_iterator(CORPUS, trainer)
    return PreTrainedTokenizerFast(
        tokenizer_object=tok,
        bos_token="<|endoftext|>",
        eos_token="<|endoftext|>",
        pad_token="<|endoftext|>",
        model_input_names=["input_ids", "attention_mask"],
    )


def build_tiny(task: str, out: Path, positions: int = 64) -> Path:
    """`positions`: the window (a long one makes generation take long enough to watch it stream)."""
    import torch
    from transformers import (
        BertConfig,
        BertForMaskedLM,
        BertForQuestionAnswering,
        BertForSequenceClassification,
        GPT2Config,
        GPT2LMHeadModel,
    )

    torch.manual_seed(0)
    if task == "text-generation":
        tokenizer = _bpe()
        config = GPT2Config(
            vocab_size=len(tokenizer),
            n_embd=32,
            n_layer=2,
            n_head=2,
            n_positions=positions,
            bos_token_id=0,
            eos_token_id=0,
        )
        model = GPT2LMHeadModel(config)
    else:
        tokenizer = _wordpiece()
        bert = dict(
            vocab_size=len(tokenizer),
            hidden_size=32,
            num_hidden_layers=2,
            num_attention_heads=2,
            intermediate_size=64,
            max_position_embeddings=positions,
        )
        if task == "text-classification":
            model = BertForSequenceClassification(
                BertConfig(
                    **bert, id2label={0: "negative", 1: "positive"}, label2id={"negative": 0, "positive": 1}
                )
            )
        elif task == "question-answering":
            model = BertForQuestionAnswering(BertConfig(**bert))
        else:
            model = BertForMaskedLM(BertConfig(**bert))
    model.save_pretrained(out)
    tokenizer.save_pretrained(out)  # type: ignore[attr-defined]
    return out
