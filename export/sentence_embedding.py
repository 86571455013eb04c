"""A sentence-embedding graph: the encoder, its pooling, projection and L2 normalisation in one ONNX graph.

Why all of it in the graph: the service then serves exactly what sentence-transformers computes without
knowing the rule, mean pooling needs the attention mask the engine already feeds, and the padded positions a
batch adds are masked out inside the graph, where they cost nothing to drop. The rule is read by
training.embeddings from the model directory (a directory written by `SentenceEncoder.save`, or any
sentence-transformers directory such as all-MiniLM-L6-v2; a plain HF encoder gets mean + normalise).

Outputs, each [batch, dimensions]: `sentence_embedding`, as the rule says; for a normalising model also
`pooled_embedding`, the same vector before normalisation, which TEI's `normalize: false` asks for (one more
row of floats per text: nothing beside the encoder's work).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import onnx
import torch
import torch.nn.functional as F
from torch import nn

from export.onnx_files import save
from service.manifest import EmbeddingSpec
from training.embeddings import SentenceEncoder, pool

SENTENCE_OUTPUT = "sentence_embedding"
POOLED_OUTPUT = "pooled_embedding"


class SentenceEmbeddingGraph(nn.Module):
    """`SentenceEncoder.forward` with the vector before normalisation kept as a second output."""

    def __init__(self, encoder: SentenceEncoder) -> None:
        super().__init__()
        self.encoder = encoder

    def forward(
        self,
        input_ids: torch.Tensor,
        attention_mask: torch.Tensor,
        token_type_ids: torch.Tensor | None = None,
    ) -> tuple[torch.Tensor, ...]:
        extra = {} if token_type_ids is None else {"token_type_ids": token_type_ids}
        hidden = self.encoder.backbone(input_ids=input_ids, attention_mask=attention_mask, **extra)
        pooled = pool(hidden.last_hidden_state, attention_mask, self.encoder.pooling.mode)
        if self.encoder.projection is not None:
            pooled = self.encoder.projection(pooled)
        if not self.encoder.pooling.normalize:
            return (pooled,)
        return F.normalize(pooled, p=2, dim=-1), pooled


def output_names(encoder: SentenceEncoder) -> list[str]:
    return [SENTENCE_OUTPUT, POOLED_OUTPUT] if encoder.pooling.normalize else [SENTENCE_OUTPUT]


def embedding_spec(encoder: SentenceEncoder) -> EmbeddingSpec:
    """What the manifest says of the graph's embeddings."""
    return EmbeddingSpec(
        dimensions=encoder.dim,
        normalized=encoder.pooling.normalize,
        pooling=encoder.pooling.mode,
        output=SENTENCE_OUTPUT,
        pooled_output=POOLED_OUTPUT if encoder.pooling.normalize else None,
    )


def load_sentence_reference(model_dir: Path) -> tuple[Any, Any]:
    """The PyTorch reference (a SentenceEncoder with the directory's rule) and its HF tokenizer.

    The export pipeline reads an HF config off every reference (window, vocabulary, labels): the encoder
    carries its backbone's as `config`."""
    from transformers import AutoTokenizer

    model: Any = SentenceEncoder.load(model_dir).eval()
    model.config = model.backbone.config
    return model, AutoTokenizer.from_pretrained(model_dir)


def export_sentence_embedding(model_dir: Path, out_dir: Path, opset: int) -> Path:
    """Write `model_dir`'s SentenceEncoder as `out_dir/model.onnx`, beside its config (the optimized
    variant's ORT optimizer reads the model type) and tokenizer, as optimum lays out its exports."""
    encoder, tokenizer = load_sentence_reference(model_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    path = out_dir / "model.onnx"
    token_types = "token_type_ids" in tokenizer.model_input_names
    input_names = ["input_ids", "attention_mask", *(["token_type_ids"] if token_types else [])]
    outputs = output_names(encoder)
    dynamic = {name: {0: "batch_size", 1: "sequence_length"} for name in input_names}
    dynamic |= {name: {0: "batch_size"} for name in outputs}
    # a padded second row, so the traced graph takes the masked path whatever the attention kernel does
    ids = torch.full((2, 6), 5, dtype=torch.int64)
    mask = torch.ones(2, 6, dtype=torch.int64)
    mask[1, 4:] = 0
    example = [ids, mask, *([torch.zeros(2, 6, dtype=torch.int64)] if token_types else [])]
    with torch.no_grad():
        torch.onnx.export(
            SentenceEmbeddingGraph(encoder).eval(),
            tuple(example),
            str(path),
            input_names=input_names,
            output_names=outputs,
            dynamic_axes=dynamic,
            opset_version=opset,
            dynamo=False,
        )
    _fix_width(path, outputs, encoder.dim)
    encoder.backbone.config.save_pretrained(out_dir)
    tokenizer.save_pretrained(out_dir)
    return path


def _fix_width(path: Path, outputs: list[str], width: int) -> None:
    """Declare the outputs' second axis as the embedding width: the service reads a symbolic second axis
    as a sequence axis (service.runtime.per_position_outputs) and would cut each row to its text's length."""
    model = onnx.load(str(path))
    for value in model.graph.output:
        if value.name in outputs:
            dims = value.type.tensor_type.shape.dim
            dims[1].Clear()
            dims[1].dim_value = width
    save(model, path)
