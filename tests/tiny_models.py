"""Tiny untrained models of every task family, built from configs in a second (no hub here)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

CORPUS = [
    "I loved this film, it was wonderful.",
    "A dull, terrible film. I hated every minute of it.",
    "Acme was founded by John Smith in 1950 in the city of Springfield.",
    "Who founded Acme? When was it founded? Where is Springfield?",
] * 40


def _wordpiece() -> Any:
    from training.tokenizer import train_wordpiece

    return train_wordpiece(CORPUS, vocab_size=300)


def _bpe() -> Any:
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


# SmolLM2's special tokens at its ids: <|endoftext|> 0 (unk), <|im_start|> 1 (bos), <|im_end|> 2 (eos, pad).
LLAMA_SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
CHAT_TEMPLATE = (
    "{% for message in messages %}{{'<|im_start|>' + message['role'] + '\\n' + message['content'] + "
    "'<|im_end|>' + '\\n'}}{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)


def llama_bpe() -> Any:
    """A byte-level BPE as SmolLM2's: every digit split off first, then GPT-2's split; no BOS added."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.Sequence(
        [pre_tokenizers.Digits(individual_digits=True), pre_tokenizers.ByteLevel(add_prefix_space=False)]
    )
    tok.decoder = decoders.ByteLevel()
    tok.post_processor = processors.ByteLevel(trim_offsets=False)
    trainer = trainers.BpeTrainer(
        vocab_size=400, special_tokens=LLAMA_SPECIALS, initial_alphabet=pre_tokenizers.ByteLevel.alphabet()
    )
    tok.train_from_iterator(CORPUS, trainer)
    return PreTrainedTokenizerFast(
        tokenizer_object=tok,
        unk_token="<|endoftext|>",
        bos_token="<|im_start|>",
        eos_token="<|im_end|>",
        pad_token="<|im_end|>",
        model_input_names=["input_ids", "attention_mask"],
        chat_template=CHAT_TEMPLATE,
    )


def tiny_llama(
    vocab_size: int, positions: int = 64, seed: int = 0, std: float | None = None, **overrides: object
) -> Any:
    """An untrained Llama with everything SmolLM2 has: rotary positions, grouped-query attention (4 query
    heads over 2 key/value heads), RMSNorm, a gated MLP and the output head tied to the embeddings.

    `std`: weights drawn wider than the 0.02 init give logits far apart, a harder test of the numerics;
    int8 agreement is then poor, as on any random model whose answers hinge on tiny margins. `overrides`:
    other LlamaConfig fields (e.g. num_key_value_heads=4, tie_word_embeddings=False)."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(seed)
    config = LlamaConfig(
        vocab_size=vocab_size,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=positions,
        rope_theta=10000.0,
        rms_norm_eps=1e-5,
        tie_word_embeddings=True,
        bos_token_id=1,
        eos_token_id=2,
        pad_token_id=2,
    )
    config.update(overrides)
    model = LlamaForCausalLM(config).eval()
    if std is not None:
        with torch.no_grad():
            for parameter in model.parameters():
                if parameter.dim() == 2:
                    parameter.normal_(0.0, std)
    return model


def build_tiny_llama(out: Path, positions: int = 64) -> Path:
    """An untrained tiny GQA Llama HF directory with a SmolLM2-like tokenizer and chat template."""
    tokenizer = llama_bpe()
    model = tiny_llama(len(tokenizer), positions)
    model.save_pretrained(out)
    tokenizer.save_pretrained(out)
    return out


def q4_1(weight: Any) -> Any:
    """`weight` [out, in] (numpy) through GGUF's Q4_1 and back, as llama.cpp quantizes (a block of 32's
    minimum and range / 15 in fp16) and gguf-py dequantizes (`d * q + m` in float32)."""
    import numpy as np

    out, inputs = weight.shape
    blocks = weight.reshape(out, inputs // 32, 32).astype(np.float32)
    low, high = blocks.min(-1), blocks.max(-1)
    d = ((high - low) / 15).astype(np.float16).astype(np.float32)
    m = low.astype(np.float16).astype(np.float32)
    q = np.clip(np.floor((blocks - low[..., None]) / np.where(d > 0, d, 1)[..., None] + 0.5), 0, 15)
    return (d[..., None] * q.astype(np.float32) + m[..., None]).reshape(out, inputs).astype(np.float32)


def build_q4_llama(source: Path, out: Path) -> Path:
    """The tiny Llama at `source` as a GGUF import in Q4_1 would be: every Linear layer on its 4-bit grid,
    the tied embedding table (Q8_0 in SmolLM2's file) as it was."""
    import shutil

    import torch
    from transformers import AutoModelForCausalLM

    shutil.copytree(source, out)
    model = AutoModelForCausalLM.from_pretrained(out)
    with torch.no_grad():
        for module in model.model.layers.modules():
            if isinstance(module, torch.nn.Linear):
                module.weight.copy_(torch.from_numpy(q4_1(module.weight.numpy())))
    model.save_pretrained(out)
    return out


def tiny_bert_settings(vocab_size: int, layers: int = 2, positions: int = 128, **more: Any) -> dict[str, Any]:
    """BertConfig settings of the tests' tiny encoders: 32 wide, 2 heads, `layers` deep."""
    return dict(
        vocab_size=vocab_size,
        hidden_size=32,
        num_hidden_layers=layers,
        num_attention_heads=2,
        intermediate_size=64,
        max_position_embeddings=positions,
        **more,
    )


def build_cross_encoder(out: Path, seed: int = 0, positions: int = 64) -> Path:
    """An untrained tiny BERT of one label: a cross-encoder reading (query, document) pairs. Its weights
    are drawn wide (std 0.5, not 0.02) so that its logits for different documents differ by whole units,
    as a trained ranker's do, rather than by 1e-5."""
    import torch
    from transformers import BertConfig, BertForSequenceClassification

    torch.manual_seed(seed)
    tokenizer = _wordpiece()
    settings = tiny_bert_settings(len(tokenizer), positions=positions)
    model = BertForSequenceClassification(BertConfig(**settings, num_labels=1, initializer_range=0.5))
    model.save_pretrained(out)
    tokenizer.save_pretrained(out)
    return out


def build_tiny(task: str, out: Path, positions: int = 64, seed: int = 0) -> Path:
    """`positions`: the window (a long one makes generation take long enough to watch it stream); `seed`:
    another seed gives another model of the same shape (a cascade's student beside its teacher)."""
    import torch
    from transformers import (
        BertConfig,
        BertForMaskedLM,
        BertForQuestionAnswering,
        BertForSequenceClassification,
        GPT2Config,
        GPT2LMHeadModel,
    )

    torch.manual_seed(seed)
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
        model: Any = GPT2LMHeadModel(config)
    else:
        tokenizer = _wordpiece()
        bert = tiny_bert_settings(len(tokenizer), positions=positions)
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
    tokenizer.save_pretrained(out)
    return out


def export_lm_pair(
    root: Path,
    self_student: str | None = None,
    student_variants: tuple[str, ...] = ("fp32",),
    draft_head_tokens: int | None = None,
) -> tuple[Path, Path]:
    """A tiny GPT-2 teacher (`lm-teacher`) and a student of another seed paired with it (`lm`) in
    `root/models`; `self_student`: also the teacher exported under that name as its own student;
    `student_variants`: the students' (a draft variant is checked on generated inputs), a draft's head cut
    to `draft_head_tokens` where given (the 355-token vocabulary is under export's default). Returns the
    repository and the teacher's HF directory (PyTorch's reference)."""
    from export.pipeline import PairSpec, export_model
    from export.variants import DRAFT_HEAD_TOKENS
    from service.manifest import TeacherRef

    teacher_dir = build_tiny("text-generation", root / "teacher", positions=64, seed=0)
    student_dir = build_tiny("text-generation", root / "student", positions=64, seed=1)
    repository = root / "models"
    assert export_model(teacher_dir, "text-generation", "lm-teacher", repository, ("fp32",)).version_dir
    cut = DRAFT_HEAD_TOKENS if draft_head_tokens is None else draft_head_tokens
    pair = PairSpec(TeacherRef(name="lm-teacher", version=1), teacher_dir, draft_head_tokens=cut)
    students = [("lm", student_dir)] + ([(self_student, teacher_dir)] if self_student else [])
    for name, source in students:
        exported = export_model(
            source, "text-generation", name, repository, student_variants, pair=pair, require_eval_data=False
        )
        assert {r.variant for r in exported.variants if r.passed} == set(student_variants)
    return repository, teacher_dir
