"""The mask-scoring fill-mask graph gives PyTorch's logits at each text's mask, and only there."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnxruntime as ort

from export.onnx_export import export_onnx
from export.tasks import first_mask_positions


def test_each_row_gets_pytorch_logits_at_its_first_mask(tiny_models: dict[str, Path], tmp_path: Path) -> None:
    import torch
    from transformers import AutoModelForMaskedLM, AutoTokenizer

    model_dir = tiny_models["fill-mask"]
    session = ort.InferenceSession(
        str(export_onnx(model_dir, "fill-mask", tmp_path)), providers=["CPUExecutionProvider"]
    )
    model = AutoModelForMaskedLM.from_pretrained(model_dir).eval()
    mask_id = AutoTokenizer.from_pretrained(model_dir).mask_token_id
    rng = np.random.default_rng(0)
    ids = rng.integers(5, model.config.vocab_size, size=(4, 9))
    ids[ids == mask_id] = 5
    ids[0, 1] = ids[1, 7] = ids[2, 3] = ids[2, 6] = mask_id  # row 2: two masks; row 3: none
    mask = np.ones_like(ids)
    mask[1, 8:] = 0  # a padded row
    feeds = {"input_ids": ids, "attention_mask": mask, "token_type_ids": np.zeros_like(ids)}
    names = {i.name for i in session.get_inputs()}
    (logits,) = session.run(["logits"], {k: v for k, v in feeds.items() if k in names})
    with torch.no_grad():
        full = model(**{k: torch.from_numpy(v) for k, v in feeds.items()}).logits.numpy()
    rows = first_mask_positions(ids, mask_id)
    assert rows.tolist() == [1, 7, 3, 0]  # the first mask; position 0 for a row without one
    assert logits.shape == (4, 1, model.config.vocab_size)  # one row a text, not one a position
    np.testing.assert_allclose(logits[:, 0], full[np.arange(4), rows], atol=1e-4)
