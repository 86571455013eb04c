"""A fill-mask graph that runs the vocabulary head at the mask only: `logits` is [batch, 1, vocab].

optimum's fill-mask graph scores every position: [batch, sequence, vocab] logits, of which the service
reads one row per text. The head (a hidden x vocab matrix product per position) is then most of the work
of a small student with a BERT vocabulary, and the full output is written, and on a GPU copied to the
host, for nothing: a MiniLM-shaped model with BERT's 30,522-token vocabulary took 70 ms for 8 texts of 32
tokens on 2 CPU cores scoring every position, 37 ms scoring the mask. Here each row's hidden state at its
first mask token is picked before the head runs. The service accepts exactly one mask a text, and a row
without one scores position 0. Every module is the Hugging Face model's own, so the numerics are its own.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch
from torch import nn


class MaskScoring(nn.Module):
    """A `...ForMaskedLM` whose head sees only each row's first mask position.

    Masked-LM heads are applied position by position to the base model's first output, so a hook on the
    base model narrows that output to one position a row, whatever the architecture calls its head."""

    def __init__(self, model: Any, mask_token_id: int) -> None:
        super().__init__()
        self.model = model
        self.mask_token_id = mask_token_id
        self._rows: torch.Tensor | None = None
        model.base_model.register_forward_hook(self._keep_mask_position)

    def forward(
        self,
        input_ids: torch.Tensor,
        attention_mask: torch.Tensor,
        token_type_ids: torch.Tensor | None = None,
    ) -> torch.Tensor:
        # as export.tasks.first_mask_positions: the first mask, position 0 in a row without one
        self._rows = (input_ids == self.mask_token_id).to(torch.int64).argmax(dim=1)
        extra = {} if token_type_ids is None else {"token_type_ids": token_type_ids}
        logits: torch.Tensor = self.model(input_ids=input_ids, attention_mask=attention_mask, **extra).logits
        return logits

    def _keep_mask_position(self, module: nn.Module, args: Any, output: Any) -> Any:
        assert self._rows is not None
        hidden = output[0]
        picked = hidden[torch.arange(hidden.shape[0]), self._rows].unsqueeze(1)  # [batch, 1, hidden]
        if isinstance(output, tuple):
            return (picked, *output[1:])
        output["last_hidden_state"] = picked  # a ModelOutput: item and attribute stay in step
        return output


def export_mask_scoring(model: Any, mask_token_id: int, token_types: bool, out: Path, opset: int) -> None:
    """Write `model` (a ...ForMaskedLM) as a mask-scoring graph with the names optimum's graph uses;
    `token_types`: the model takes token_type_ids (BERT does, RoBERTa and DistilBERT do not)."""
    input_names = ["input_ids", "attention_mask", *(["token_type_ids"] if token_types else [])]
    dynamic = {name: {0: "batch_size", 1: "sequence_length"} for name in input_names}
    dynamic["logits"] = {0: "batch_size"}
    batch, length = 2, 5
    ids = torch.full((batch, length), 5, dtype=torch.int64)
    ids[0, 1], ids[1, 3] = mask_token_id, mask_token_id
    example = [ids, torch.ones(batch, length, dtype=torch.int64)]
    if token_types:
        example.append(torch.zeros(batch, length, dtype=torch.int64))
    with torch.no_grad():
        torch.onnx.export(
            MaskScoring(model, mask_token_id).eval(),  # eval() on the wrapper: see appending_decoder
            tuple(example),
            str(out),
            input_names=input_names,
            output_names=["logits"],
            dynamic_axes=dynamic,
            opset_version=opset,
            dynamo=False,
            do_constant_folding=False,  # keep the tied head shared with the embeddings (appending_decoder)
        )
