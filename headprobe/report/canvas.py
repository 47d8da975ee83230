"""Matplotlib plumbing shared by the report's figures: an Agg canvas without pyplot, colours, record series."""

from __future__ import annotations

import math
from collections.abc import Sequence
from pathlib import Path

DPI = 110
BACKBONE_COLOR = "#555555"


def new_figure(width: float, height: float):
    """A figure on its own Agg canvas: no pyplot, no global state, nothing opened on a display."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    fig = Figure(figsize=(width, height), layout="constrained")
    FigureCanvasAgg(fig)
    return fig


def save(fig, path: Path) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=DPI)
    return path


def head_colors(heads: Sequence[str]) -> dict[str, str]:
    """One tab10 colour per head, in order, so a head keeps its colour in every figure of a report."""
    from matplotlib import colormaps

    palette = colormaps["tab10"].colors
    return {head: "#" + "".join(f"{round(c * 255):02x}" for c in palette[i % len(palette)][:3])
            for i, head in enumerate(heads)}


def series(records: Sequence[dict], key: str) -> tuple[list[float], list[float]]:
    """(steps, values) of `key` in training records that hold a number for it."""
    pairs = [(r["step"], r[key]) for r in records
             if isinstance(r.get(key), (int, float)) and not isinstance(r.get(key), bool)]
    return [p[0] for p in pairs], [p[1] for p in pairs]


def log_if_wide(ax, values: Sequence[float], ratio: float = 30) -> None:
    """Log y-axis when all values are positive and span more than `ratio`."""
    finite = [v for v in values if math.isfinite(v)]
    if finite and min(finite) > 0 and max(finite) / min(finite) > ratio:
        ax.set_yscale("log")
