"""One figure per report: axes to draw on, saved as a PNG beside the report's table when the block ends."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any


@contextmanager
def saved_figure(out: Path, size: tuple[float, float], columns: int = 1) -> Iterator[list[Any]]:
    """A row of `columns` matplotlib axes (headless) for the caller to draw and label; the figure goes to
    `out` when the block ends, then is closed (also when drawing fails)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figure, axes = plt.subplots(1, columns, figsize=size, squeeze=False)
    try:
        yield list(axes[0])
        figure.tight_layout()
        figure.savefig(out, dpi=110)
    finally:
        plt.close(figure)


@contextmanager
def saved_axes(
    out: Path, size: tuple[float, float], title: str, xlabel: str, ylabel: str, legend_at: str = "best"
) -> Iterator[Any]:
    """One pair of axes, labelled; its legend drawn (at `legend_at`) once the caller has plotted."""
    with saved_figure(out, size) as (axis,):
        axis.set_title(title)
        axis.set_xlabel(xlabel)
        axis.set_ylabel(ylabel)
        yield axis
        axis.legend(fontsize=8, loc=legend_at)
