"""Static SVG plots for the comparison pages (matplotlib, Agg, no pyplot global state).

The site must work offline, so plots are files next to the page, not a charting script. SVGs
are written with a fixed hash salt and no date, so regenerating unchanged results leaves the
files byte-identical.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import matplotlib
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure
from matplotlib.ticker import MaxNLocator

_RC = {"svg.hashsalt": "policykit", "svg.fonttype": "none", "font.size": 9}
CRASHED = "#c62828"
FINE = "#1565c0"


def _save(fig: Figure, path: Path) -> Path:
    FigureCanvasAgg(fig)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, format="svg", metadata={"Date": None}, bbox_inches="tight")
    return path


def _height(n: int) -> float:
    return max(2.0, 0.32 * n + 1.2)


def bar_chart(
    path: Path,
    labels: Sequence[str],
    values: Sequence[float | None],
    *,
    title: str,
    xlabel: str,
    crashed: Sequence[bool] = (),
) -> Path:
    """Horizontal bars, one per combination; crashed combinations in red, missing values empty."""
    with matplotlib.rc_context(_RC):
        fig = Figure(figsize=(7.5, _height(len(labels))))
        ax = fig.add_subplot()
        ys = range(len(labels))
        colours = [CRASHED if i < len(crashed) and crashed[i] else FINE for i in ys]
        ax.barh(list(ys), [v or 0 for v in values], color=colours)
        ax.set_yticks(list(ys), labels=list(labels))
        ax.invert_yaxis()
        ax.set_xlabel(xlabel)
        ax.set_title(title, loc="left")
        ax.grid(axis="x", alpha=0.3)
        return _save(fig, path)


def paired_bar_chart(
    path: Path,
    labels: Sequence[str],
    first: Sequence[float | None],
    second: Sequence[float | None],
    *,
    names: tuple[str, str],
    title: str,
    xlabel: str,
) -> Path:
    """Two bars per combination (TTFT p50 and p99)."""
    with matplotlib.rc_context(_RC):
        fig = Figure(figsize=(7.5, _height(len(labels))))
        ax = fig.add_subplot()
        ys = list(range(len(labels)))
        ax.barh([y - 0.2 for y in ys], [v or 0 for v in first], height=0.4, label=names[0])
        ax.barh([y + 0.2 for y in ys], [v or 0 for v in second], height=0.4, label=names[1])
        ax.set_yticks(ys, labels=list(labels))
        ax.invert_yaxis()
        ax.set_xlabel(xlabel)
        ax.set_title(title, loc="left")
        ax.legend(loc="lower right")
        ax.grid(axis="x", alpha=0.3)
        return _save(fig, path)


def line_chart(
    path: Path, series: Sequence[tuple[str, Sequence[float]]], *, title: str, ylabel: str
) -> Path:
    """Pool utilisation over rounds: one line (with markers) per labelled series."""
    with matplotlib.rc_context(_RC):
        fig = Figure(figsize=(7.5, 3.6))
        ax = fig.add_subplot()
        for label, ys in series:
            ax.plot(range(1, len(ys) + 1), [100 * y for y in ys], marker="o", label=label)
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))
        ax.set_xlabel("round")
        ax.set_ylabel(ylabel)
        ax.set_ylim(0, 105)
        ax.set_title(title, loc="left")
        ax.grid(alpha=0.3)
        if series:
            ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(0.0, -0.2), frameon=False)
        return _save(fig, path)
