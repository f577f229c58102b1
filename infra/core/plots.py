"""Charts as SVG, drawn by matplotlib without a display: the same figures give the same file (no random ids, no
date), so a regenerated picture changes only where its numbers do."""

import io
from pathlib import Path

import matplotlib

matplotlib.use("Agg")  # files only, no display
import matplotlib.pyplot as plt
from matplotlib.axes import Axes
from matplotlib.figure import Figure


def new_figure(rows: int, columns: int, size: tuple[float, float]) -> tuple[Figure, list[Axes]]:
    """A figure of rows x columns panels, `size` inches, and its panels in reading order."""
    fig, axes = plt.subplots(rows, columns, figsize=size, squeeze=False)
    return fig, [ax for row in axes for ax in row]


def svg_text(fig: Figure, text: bool = False) -> str:
    """`fig` as SVG; the figure is closed. `text`: letters as SVG text (smaller, searchable, drawn in the reader's
    sans-serif) rather than as outlines (the same on every screen)."""
    out = io.StringIO()
    with plt.rc_context({"svg.hashsalt": "trainflow", "svg.fonttype": "none" if text else "path"}):
        fig.savefig(out, format="svg", metadata={"Date": None})
    plt.close(fig)
    return out.getvalue()


def save_svg(fig: Figure, path: Path) -> None:
    """`fig` written to `path` as SVG (letters as outlines); the figure is closed."""
    path.write_text(svg_text(fig))
