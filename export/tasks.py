"""What differs per task when exporting: model class, compared outputs, parity inputs, graph feeds."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from common.logit_positions import LOGIT_POSITIONS, every_position
from export.parity import Feeds, Outputs, generated_batches
from service.manifest import GenerationLayout, Task


@dataclass(frozen=True)
class TaskSpec:
    task: Task
    optimum_task: str
    auto_class: str  # the transformers Auto class of the PyTorch reference
    outputs: tuple[str, ...]  # graph outputs the parity gate compares
    per_position: bool  # outputs have a sequence axis (padding must be ignored)
    cosine: bool = False  # rows are judged by cosine with PyTorch's, not by argmax (embeddings)


SPECS: dict[str, TaskSpec] = {
    "text-classification": TaskSpec(
        "text-classification", "text-classification", "AutoModelForSequenceClassification", ("logits",), False
    ),
    "question-answering": TaskSpec(
        "question-answering",
        "question-answering",
        "AutoModelForQuestionAnswering",
        ("start_logits", "end_logits"),
        True,
    ),
    # the mask-scoring graph's logits: [batch, 1, vocab], one row a text (export.mask_scoring)
    "fill-mask": TaskSpec("fill-mask", "fill-mask", "AutoModelForMaskedLM", ("logits",), False),
    "text-generation": TaskSpec(
        "text-generation", "text-generation-with-past", "AutoModelForCausalLM", ("logits",), True
    ),
    # the reference is training.embeddings.SentenceEncoder (export.sentence_embedding), not an Auto class
    "sentence-embeddings": TaskSpec(
        "sentence-embeddings", "feature-extraction", "AutoModel", ("sentence_embedding",), False, cosine=True
    ),
}


def load_reference(model_dir: Path, spec: TaskSpec) -> tuple[Any, Any]:
    """The PyTorch model and HF tokenizer the ONNX graph must reproduce."""
    import transformers

    from training.models import check_trained_for

    if spec.task == "sentence-embeddings":
        from export.sentence_embedding import load_sentence_reference

        return load_sentence_reference(model_dir)
    check_trained_for(transformers.AutoConfig.from_pretrained(model_dir), spec.task, model_dir)
    model = getattr(transformers, spec.auto_class).from_pretrained(model_dir).eval()
    tokenizer = transformers.AutoTokenizer.from_pretrained(model_dir)
    return model, tokenizer


def position_ids(attention_mask: np.ndarray, past_length: int = 0) -> np.ndarray:
    """GPT-2 positions of right-padded rows: 0, 1, ... over the real tokens (padding clamps to 0)."""
    return np.clip(np.cumsum(attention_mask, axis=1) - 1, 0, None).astype(np.int64) + past_length


def first_mask_positions(input_ids: np.ndarray, mask_token_id: int) -> np.ndarray:
    """Each row's first mask position, 0 where there is none: what the mask-scoring graph scores."""
    return np.argmax(input_ids == mask_token_id, axis=1)


def torch_outputs(model: Any, spec: TaskSpec, feeds: Feeds, mask_token_id: int | None = None) -> Outputs:
    """What the exported graph must reproduce: the model's outputs (for fill-mask, at each row's first mask
    only, as export.mask_scoring's graph scores them: [batch, 1, vocab])."""
    import torch

    inputs = {k: torch.from_numpy(v) for k, v in feeds.items()}
    if spec.task == "sentence-embeddings":  # training.embeddings.SentenceEncoder: the rule it trained with
        with torch.no_grad():
            return {"sentence_embedding": model(**inputs).embedding.float().numpy()}
    if spec.task == "text-generation":
        inputs["position_ids"] = torch.from_numpy(position_ids(feeds["attention_mask"]))
        inputs.pop("token_type_ids", None)
    with torch.no_grad():
        out = model(**inputs)
    outputs = {name: getattr(out, name).float().numpy() for name in spec.outputs}
    if spec.task == "fill-mask":
        assert mask_token_id is not None
        rows = first_mask_positions(feeds["input_ids"], mask_token_id)
        outputs["logits"] = outputs["logits"][np.arange(len(rows)), rows][:, None]
    return outputs


APPENDING_TYPES = ("gpt2", "llama")  # decoders exported as distilserve's appending graph


def decoder_shape(config: Any) -> tuple[int, int, int, int]:
    """(layers, attention heads, key/value heads, head dim) from a GPT-2 or Llama-style config; the cache
    holds key/value heads, fewer than the attention heads under grouped-query attention."""
    heads = int(getattr(config, "n_head", None) or config.num_attention_heads)
    hidden = int(getattr(config, "n_embd", None) or config.hidden_size)
    layers = int(getattr(config, "n_layer", None) or config.num_hidden_layers)
    kv_heads = int(getattr(config, "num_key_value_heads", None) or heads)
    head_dim = int(getattr(config, "head_dim", None) or hidden // heads)
    return layers, heads, kv_heads, head_dim


def generation_layout(
    config: Any, tokenizer: Any, generation_config: Any = None, chat_eos_token: str | None = None
) -> GenerationLayout:
    """KV-cache layout of the decoder export: distilserve's appending graph where the architecture has
    one (GPT-2, Llama), optimum's text-generation-with-past graph otherwise (one merged graph).

    `generation_config` (the model's, from generation_config.json) and `chat_eos_token` (the chat template's
    end-of-turn token) add stop ids to the tokenizer's eos: Llama-3's chat turns end at <|eot_id|>, which
    only its generation config names."""
    layers, heads, kv_heads, head_dim = decoder_shape(config)
    first_eos = _ids(config.eos_token_id)
    eos = tokenizer.eos_token_id if tokenizer.eos_token_id is not None else next(iter(first_eos), None)
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else eos
    return GenerationLayout(
        num_layers=layers,
        num_heads=heads,
        num_key_value_heads=kv_heads,
        head_dim=head_dim,
        eos_token_id=eos,
        stop_token_ids=stop_token_ids(config, tokenizer, generation_config, chat_eos_token),
        pad_token_id=pad,
        present_positions="new" if appends(config) else "all",
    )


def stop_token_ids(
    config: Any, tokenizer: Any, generation_config: Any = None, chat_eos_token: str | None = None
) -> list[int]:
    """Every id generation should end at, first seen first: the tokenizer's eos, the generation config's
    eos ids (an int or a list), the model config's, and the chat template's eos token."""
    found = [
        *_ids(tokenizer.eos_token_id),
        *_ids(getattr(generation_config, "eos_token_id", None)),
        *_ids(getattr(config, "eos_token_id", None)),
    ]
    if chat_eos_token is not None:
        chat_id = tokenizer.convert_tokens_to_ids(chat_eos_token)
        if chat_id is not None and chat_id != tokenizer.unk_token_id:
            found += _ids(chat_id)
    return list(dict.fromkeys(found))


def _ids(value: Any) -> list[int]:
    """HF's `eos_token_id` as a list: None, one id, or several."""
    if value is None:
        return []
    return [int(v) for v in value] if isinstance(value, list | tuple) else [int(value)]


def appends(config: Any) -> bool:
    """Whether the decoder is exported as distilserve's appending graph (export/appending_decoder.py)."""
    return getattr(config, "model_type", None) in APPENDING_TYPES and not getattr(
        config, "add_cross_attention", False
    )


def onnx_feeds(feeds: Feeds, input_names: Sequence[str], layout: GenerationLayout | None) -> Feeds:
    """The graph's own feeds: task inputs it declares, plus an empty KV cache for a decoder's first step."""
    out = {k: v for k, v in feeds.items() if k in input_names}
    if layout is not None:
        batch = feeds["input_ids"].shape[0]
        empty = np.zeros((batch, layout.num_key_value_heads, 0, layout.head_dim), dtype=np.float32)
        for layer in range(layout.num_layers):
            out[layout.past_key_name.format(layer=layer)] = empty
            out[layout.past_value_name.format(layer=layer)] = empty
        out["position_ids"] = position_ids(feeds["attention_mask"])
        if LOGIT_POSITIONS in input_names:  # compared with PyTorch at every position
            out[LOGIT_POSITIONS] = every_position(*feeds["input_ids"].shape)
    return out


# PyTorch's outputs are kept for every parity batch while each variant is compared with them. A decoder's
# are [rows, positions, vocabulary]: SmolLM2 (49,152 tokens) at its 8k window would hold ~25 GB for the
# generated batches alone. Half the budget goes to the generated batches, half to the eval texts.
PARITY_OUTPUT_BYTES = 2 << 30
EVAL_TEXTS = 256
GENERATED_BATCH_SIZES = (1, 4, 16)


def parity_extent(spec: TaskSpec, config: Any, max_length: int) -> tuple[int, int]:
    """(longest parity input, eval texts compared): the model's window and EVAL_TEXTS, unless a decoder's
    per-position vocabulary logits would outgrow PARITY_OUTPUT_BYTES; then shorter inputs (at least 64
    tokens: the graph is the same at any length) and fewer eval texts (at least 8)."""
    if spec.task != "text-generation":
        return max_length, EVAL_TEXTS
    position_bytes = 4 * int(config.vocab_size)
    generated_rows = sum(GENERATED_BATCH_SIZES)
    length = min(max_length, max(64, PARITY_OUTPUT_BYTES // 2 // (generated_rows * position_bytes)))
    texts = min(EVAL_TEXTS, max(8, PARITY_OUTPUT_BYTES // 2 // (length * position_bytes)))
    return length, texts


def generated_inputs(spec: TaskSpec, tokenizer: Any, config: Any, max_length: int, seed: int) -> list[Feeds]:
    """Random token batches of varied lengths and sizes (for a decoder: no [CLS]/[SEP] framing)."""
    decoder = spec.task == "text-generation"
    batches = generated_batches(
        vocab_size=int(config.vocab_size),
        special_ids=tokenizer.all_special_ids,
        max_length=max_length,
        cls_id=None if decoder else tokenizer.cls_token_id,
        sep_id=None if decoder else tokenizer.sep_token_id,
        pad_id=_pad_id(tokenizer),
        seed=seed,
        batch_sizes=GENERATED_BATCH_SIZES,
        with_token_types="token_type_ids" in tokenizer.model_input_names,
    )
    if spec.task == "fill-mask":  # one mask a row, anywhere between [CLS] and [SEP], as a client sends it
        rng = np.random.default_rng(seed)
        for feeds in batches:
            for row, length in enumerate(feeds["attention_mask"].sum(axis=1)):
                if length > 2:
                    feeds["input_ids"][row, rng.integers(1, length - 1)] = tokenizer.mask_token_id
    return batches


def _pad_id(tokenizer: Any) -> int:
    for candidate in (tokenizer.pad_token_id, tokenizer.eos_token_id, 0):
        if candidate is not None:
            return int(candidate)
    return 0


def eval_texts(spec: TaskSpec, path: Path, limit: int) -> list[str] | list[tuple[str, str]]:
    """Inputs from the task's eval file (the formats of training.data), for agreement on real text."""
    from training.data import loaders

    if spec.task == "text-classification":  # pairs of texts where the file has them (a cross-encoder's)
        examples = loaders.load_classification(path).examples[:limit]
        if examples and examples[0].pair is not None:
            return [(e.text, e.pair or "") for e in examples]
        return [e.text for e in examples]
    if spec.task == "question-answering":
        return [(e.question, e.context) for e in loaders.load_squad(path)[:limit]]
    if spec.task == "sentence-embeddings":
        from training.data.sentences import load_sentences

        return load_sentences(path).lines[:limit]
    return loaders.load_text_data(path).lines[:limit]


def eval_inputs(
    spec: TaskSpec, tokenizer: Any, path: Path, max_length: int, limit: int = 256, batch_size: int = 16
) -> list[Feeds]:
    """Tokenized eval batches; fill-mask text gets 15 % of its tokens masked, as a client would send it."""
    texts = eval_texts(spec, path, limit)
    rng = np.random.default_rng(0)
    batches: list[Feeds] = []
    for start in range(0, len(texts), batch_size):
        chunk = texts[start : start + batch_size]
        if spec.task == "question-answering":
            questions, contexts = zip(*chunk, strict=True)
            encoded = tokenizer(
                list(questions), list(contexts), truncation="only_second", max_length=max_length, padding=True
            )
        elif chunk and isinstance(chunk[0], tuple):  # pairs read together, the longer cut first
            firsts, seconds = zip(*chunk, strict=True)
            encoded = tokenizer(
                list(firsts), list(seconds), truncation="longest_first", max_length=max_length, padding=True
            )
        else:
            special = spec.task != "text-generation"
            encoded = tokenizer(
                list(chunk), truncation=True, max_length=max_length, padding=True, add_special_tokens=special
            )
        feeds = {
            k: np.asarray(v, dtype=np.int64) for k, v in encoded.items() if k in tokenizer.model_input_names
        }
        if spec.task == "fill-mask":
            _mask_tokens(feeds, tokenizer, rng)
        batches.append(feeds)
    return batches


def _mask_tokens(feeds: Feeds, tokenizer: Any, rng: np.random.Generator) -> None:
    ids = feeds["input_ids"]
    ordinary = feeds["attention_mask"].astype(bool) & ~np.isin(ids, tokenizer.all_special_ids)
    ids[ordinary & (rng.random(ids.shape) < 0.15)] = tokenizer.mask_token_id
