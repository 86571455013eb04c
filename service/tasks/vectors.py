"""Embedding vectors, as the sentence-embeddings task, retrieval and similarity share them: a model's spec,
its outputs stacked into rows, rows of unit length and the cosines between two sets of rows."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:
    from service.manifest import EmbeddingSpec
    from service.served import ServedModel

EMBEDDINGS = "sentence-embeddings"  # the task, as manifests name it


def embedding_spec(model: ServedModel) -> EmbeddingSpec:
    spec = model.manifest.embedding
    assert spec is not None  # the manifest schema requires it of this task
    return spec


def stacked(outputs: Sequence[dict[str, np.ndarray]], name: str) -> np.ndarray:
    return np.stack([o[name] for o in outputs]).astype(np.float32, copy=False)


def l2_normalized(vectors: np.ndarray) -> np.ndarray:
    """Rows of unit length (a zero row stays zero), as torch's F.normalize."""
    norms = np.linalg.norm(vectors, axis=-1, keepdims=True)
    return (vectors / np.maximum(norms, 1e-12)).astype(np.float32)


def cosines(queries: np.ndarray, documents: np.ndarray) -> np.ndarray:
    """[queries, documents] cosine similarities, in float64 (a pooled model's rows need not be unit; a zero
    row has cosine 0 with everything)."""
    return np.clip(_unit64(queries) @ _unit64(documents).T, -1.0, 1.0)


def row_cosines(first: np.ndarray, second: np.ndarray) -> np.ndarray:
    """The cosine of each row of `first` with the same row of `second`, in float64."""
    return np.clip(np.einsum("ij,ij->i", _unit64(first), _unit64(second)), -1.0, 1.0)


def _unit64(rows: np.ndarray) -> np.ndarray:
    rows = rows.astype(np.float64)
    return rows / np.maximum(np.linalg.norm(rows, axis=-1, keepdims=True), 1e-12)
