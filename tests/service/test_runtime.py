"""The encoder runner hands each item its own outputs, whichever fill-mask graph the repository holds."""

from __future__ import annotations

import numpy as np

from service.runtime import EncoderRunner
from service.tokenization import EncodedText

MASK, VOCAB = 4, 6


class LogitsEngine:
    """A graph whose logits at (row, position) are row * 100 + position, for every vocabulary entry."""

    provider = "CPUExecutionProvider"

    def __init__(self, mask_only: bool) -> None:
        self.mask_only = mask_only
        self.input_names = ["input_ids", "attention_mask"]

    def run(self, feeds: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        ids = feeds["input_ids"]
        rows, positions = np.indices(ids.shape)
        full = np.repeat((rows * 100 + positions)[..., None], VOCAB, axis=2).astype(np.float32)
        if self.mask_only:  # export.mask_scoring's graph: [batch, 1, vocab] at each row's first mask
            return {"logits": full[np.arange(len(ids)), np.argmax(ids == MASK, axis=1)][:, None]}
        return {"logits": full}  # optimum's: [batch, sequence, vocab]


def encoded(ids: list[int]) -> EncodedText:
    array = np.asarray(ids, dtype=np.int64)
    return EncodedText(input_ids=array, type_ids=np.zeros_like(array), offsets=[], truncated=False)


def test_both_fill_mask_graphs_give_each_text_the_row_at_its_mask() -> None:
    texts = [encoded([2, 9, MASK, 3]), encoded([2, MASK, 3])]
    per_graph = []
    for mask_only, per_position in ((False, frozenset({"logits"})), (True, frozenset())):
        runner = EncoderRunner(LogitsEngine(mask_only), 0, per_position, gather_token_id=MASK)
        per_graph.append([out["logits"] for out in runner(texts)])
    for outputs in per_graph:
        assert [o.shape for o in outputs] == [(1, VOCAB), (1, VOCAB)]
        assert [float(o[0, 0]) for o in outputs] == [2.0, 101.0]  # row 0 at position 2, row 1 at 1
