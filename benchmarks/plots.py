"""One figure per report: axes to draw on, saved as a PNG beside the report's table when the block ends."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any


@contextmanager
def saved_axes(out: Path, size: tuple[float, float], title: str, xlabel: str, ylabel: str) -> Iterator[Any]:
    """Matplotlib axes (headless), labelled; the figure goes to `out` with its legend, then is closed."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figure, axis = plt.subplots(figsize=size)
    axis.set_title(title)
    axis.set_xlabel(xlabel)
    axis.set_ylabel(ylabel)
    try:
        yield axis
        axis.legend(fontsize=8)
        figure.tight_layout()
        figure.savefig(out, dpi=110)
    finally:
        plt.close(figure)
