"""Write a tiny GGUF file as llama.cpp's converter writes SmolLM2's: a GQA Llama, 4-bit weights (Q4_1), an
8-bit embedding table (Q8_0), float32 norms, a byte-level BPE vocabulary with its merges, special ids and
chat template. The import is tested on it without the real download."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np


def _permute(weights: np.ndarray, heads: int) -> np.ndarray:
    """llama.cpp's row order for rotary weights (convert_hf_to_gguf.py), which transformers undoes."""
    return (
        weights.reshape(heads, 2, weights.shape[0] // heads // 2, *weights.shape[1:])
        .swapaxes(1, 2)
        .reshape(weights.shape)
    )


def _quant_type(name: str, array: np.ndarray) -> Any:
    from gguf import GGMLQuantizationType

    if array.ndim == 1:
        return GGMLQuantizationType.F32
    return GGMLQuantizationType.Q8_0 if name == "token_embd.weight" else GGMLQuantizationType.Q4_1


def _tokenizer_fields(tokenizer: Any) -> tuple[list[str], list[str], list[int]]:
    import json

    model = json.loads(tokenizer.backend_tokenizer.to_str())["model"]
    tokens = [t for t, _ in sorted(model["vocab"].items(), key=lambda item: item[1])]
    merges = [m if isinstance(m, str) else " ".join(m) for m in model["merges"]]
    special = set(tokenizer.all_special_tokens)
    return tokens, merges, [3 if t in special else 1 for t in tokens]


def write_tiny_gguf(
    model: Any, tokenizer: Any, path: Path, pre: str = "smollm", tokenizer_model: str = "gpt2"
) -> None:
    """Write `model` (a LlamaForCausalLM) and `tokenizer` to `path`, quantized; afterwards the model holds
    the dequantized weights, i.e. exactly what a reader of the file gets back."""
    import gguf
    import torch

    config = model.config
    writer = gguf.GGUFWriter(str(path), "llama")
    writer.add_name("tiny-smollm")
    writer.add_context_length(config.max_position_embeddings)
    writer.add_embedding_length(config.hidden_size)
    writer.add_block_count(config.num_hidden_layers)
    writer.add_feed_forward_length(config.intermediate_size)
    writer.add_head_count(config.num_attention_heads)
    writer.add_head_count_kv(config.num_key_value_heads)
    writer.add_layer_norm_rms_eps(config.rms_norm_eps)
    writer.add_rope_freq_base(config.rope_theta)
    writer.add_rope_dimension_count(config.hidden_size // config.num_attention_heads)
    writer.add_vocab_size(config.vocab_size)
    tokens, merges, types = _tokenizer_fields(tokenizer)
    writer.add_tokenizer_model(tokenizer_model)
    writer.add_tokenizer_pre(pre)
    writer.add_token_list(tokens)
    writer.add_token_merges(merges)
    writer.add_token_types(types)
    writer.add_unk_token_id(tokenizer.unk_token_id)
    writer.add_bos_token_id(tokenizer.bos_token_id)
    writer.add_eos_token_id(tokenizer.eos_token_id)
    writer.add_pad_token_id(tokenizer.pad_token_id)
    writer.add_add_bos_token(False)
    writer.add_chat_template(tokenizer.chat_template)

    names = gguf.get_tensor_name_map(gguf.MODEL_ARCH.LLAMA, config.num_hidden_layers)
    state = {k: v for k, v in model.state_dict().items() if k != "lm_head.weight"}  # tied to the embeddings
    dequantized = {}
    for key, tensor in state.items():
        name = names.get_name(key, try_suffixes=(".weight",))
        assert name is not None, key
        array = tensor.detach().float().numpy()
        if ".attn_q." in name:
            array = _permute(array, config.num_attention_heads)
        elif ".attn_k." in name:
            array = _permute(array, config.num_key_value_heads)
        qtype = _quant_type(name, array)
        if qtype == gguf.GGMLQuantizationType.F32:
            writer.add_tensor(name, array)
            continue
        data = gguf.quants.quantize(array, qtype)
        writer.add_tensor(name, data, raw_dtype=qtype)
        back = gguf.quants.dequantize(data, qtype)
        if ".attn_q." in name or ".attn_k." in name:  # the rows back in Hugging Face's order
            heads = config.num_attention_heads if ".attn_q." in name else config.num_key_value_heads
            back = _permute_back(back, heads)
        dequantized[key] = torch.from_numpy(np.ascontiguousarray(back))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    with torch.no_grad():
        for key, value in dequantized.items():
            model.state_dict()[key].copy_(value)


def _permute_back(weights: np.ndarray, heads: int) -> np.ndarray:
    return (
        weights.reshape(heads, weights.shape[0] // heads // 2, 2, *weights.shape[1:])
        .swapaxes(1, 2)
        .reshape(weights.shape)
    )
