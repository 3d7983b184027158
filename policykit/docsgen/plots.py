"""Static SVG plots for the comparison pages (matplotlib, Agg, no pyplot global state).

The site must work offline, so plots are files next to the page, not a charting script. SVGs
are written with a fixed hash salt and no date, so regenerating unchanged results leaves the
files byte-identical.

Every chart must stay readable with 80 combinations (one plugin installed multiplies the
registered ones), so: bar charts give a crashed combination a red marker and *no* bar (its
figures cover only the rounds before the crash, which would make it look best), and pool use is
drawn as small multiples of the few most different trajectories, the rest summarised as one
band, never as 80 lines sharing ten colours.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import matplotlib
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure
from matplotlib.patches import Patch, Rectangle
from matplotlib.ticker import MaxNLocator, ScalarFormatter

if TYPE_CHECKING:
    from matplotlib.typing import RcKeyType

_RC: dict[RcKeyType, Any] = {"svg.hashsalt": "policykit", "svg.fonttype": "none", "font.size": 9}
CRASHED = "#c62828"
FINE = "#1565c0"
SECOND = "#90caf9"
#: CSS pixels per inch, and per point (SVG sizes are in points)
PX_PER_INCH = 96
PX_PER_POINT = 4 / 3
#: the most panels a pool figure shows before summarising the rest
MAX_PANELS = 8
#: white margin around a saved figure, inches
PAD_INCHES = 0.1


@dataclass(frozen=True)
class Layout:
    """Measured size of a saved figure, in CSS pixels (what a browser lays out)."""

    path: Path
    width_px: float
    height_px: float
    legend_px: float  #: tallest legend's height, 0 without one
    plot_px: float  #: shortest axes' height

    @property
    def name(self) -> str:
        return self.path.name


def _save(fig: Figure, path: Path) -> Layout:
    """Write ``fig`` as SVG and measure it. One render only (the charts of 80 combinations are
    text-heavy): sizes are read back from the file, legend and axes extents from the artists
    as that render placed them."""
    canvas = FigureCanvasAgg(fig)
    fig.set_dpi(PX_PER_INCH)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(
        path, format="svg", metadata={"Date": None}, bbox_inches="tight", pad_inches=PAD_INCHES
    )
    with path.open(encoding="utf-8") as fh:
        head = fh.read(2048)
    size = {k: float(v) for k, v in re.findall(r'\b(width|height)="([\d.]+)pt"', head)[:2]}
    renderer = canvas.get_renderer()
    axes = [ax for ax in fig.axes if ax.get_visible()]
    legends = [legend for ax in axes if (legend := ax.get_legend()) is not None]
    legends += list(fig.legends)
    return Layout(
        path,
        width_px=size["width"] * PX_PER_POINT,
        height_px=size["height"] * PX_PER_POINT,
        legend_px=max((g.get_window_extent(renderer).height for g in legends), default=0.0),
        plot_px=min((ax.get_window_extent(renderer).height for ax in axes), default=0.0),
    )


def _height(n: int) -> float:
    return max(2.0, 0.22 * n + 1.2)


def _crash_note(ax, y: int, text: str) -> None:
    """A red cross and words where a crashed combination's bar would be; its label red."""
    ax.get_yticklabels()[y].set_color(CRASHED)
    ax.plot([0], [y], marker="X", color=CRASHED, markersize=7, clip_on=False)
    ax.annotate(text, (0, y), xytext=(8, 0), textcoords="offset points", va="center", color=CRASHED)


def bar_chart(
    path: Path,
    labels: Sequence[str],
    values: Sequence[float | None],
    *,
    title: str,
    xlabel: str,
    crashed: Sequence[int | None] = (),
) -> Layout:
    """Horizontal bars, one per combination. ``crashed[i]`` is the round combination ``i``
    crashed in: it gets a red cross and the words instead of a bar."""
    with matplotlib.rc_context(_RC):
        fig = Figure(figsize=(7.5, _height(len(labels))))
        ax = fig.add_subplot()
        ys = list(range(len(labels)))
        crash = [crashed[i] if i < len(crashed) else None for i in ys]
        ax.barh(
            ys,
            [0 if c is not None else v or 0 for v, c in zip(values, crash, strict=True)],
            color=FINE,
        )
        ax.set_yticks(ys, labels=list(labels))
        for y, c in zip(ys, crash, strict=True):
            if c is not None:
                _crash_note(ax, y, f"crashed in round {c}")
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
    crashed: Sequence[int | None] = (),
) -> Layout:
    """Two bars per combination (TTFT p50 and p99); crashed combinations get no bars."""
    with matplotlib.rc_context(_RC):
        fig = Figure(figsize=(7.5, _height(len(labels))))
        ax = fig.add_subplot()
        ys = list(range(len(labels)))
        crash = [crashed[i] if i < len(crashed) else None for i in ys]

        def bars(values: Sequence[float | None]) -> list[float]:
            return [0 if c is not None else v or 0 for v, c in zip(values, crash, strict=True)]

        ax.barh([y - 0.2 for y in ys], bars(first), height=0.4, label=names[0], color=FINE)
        ax.barh([y + 0.2 for y in ys], bars(second), height=0.4, label=names[1], color=SECOND)
        ax.set_yticks(ys, labels=list(labels))
        for y, c in zip(ys, crash, strict=True):
            if c is not None:
                _crash_note(ax, y, f"crashed in round {c}: no TTFT shown")
        ax.invert_yaxis()
        ax.set_xlabel(xlabel)
        ax.set_title(title, loc="left")
        ax.legend(loc="lower right")
        ax.grid(axis="x", alpha=0.3)
        return _save(fig, path)


@dataclass(frozen=True)
class Trajectory:
    """Pool use per round of one or more combinations that behaved identically."""

    labels: tuple[str, ...]
    values: tuple[float, ...]  #: fraction of the pool, per round
    crash_round: int | None = None

    @property
    def title(self) -> str:
        more = f" (+{len(self.labels) - 1} alike)" if len(self.labels) > 1 else ""
        return self.labels[0] + more


def group_trajectories(
    runs: Sequence[tuple[str, Sequence[float], int | None]],
) -> list[Trajectory]:
    """Combinations with the same pool use in every round (and the same crash) share one."""
    groups: dict[tuple[tuple[float, ...], int | None], list[str]] = {}
    for label, values, crash in runs:
        groups.setdefault((tuple(round(v, 4) for v in values), crash), []).append(label)
    return [Trajectory(tuple(labels), ys, crash) for (ys, crash), labels in groups.items()]


def _distance(a: Trajectory, b: Trajectory) -> float:
    """Mean absolute difference, the shorter run held at its last value."""
    n = max(len(a.values), len(b.values), 1)

    def at(t: Trajectory, i: int) -> float:
        if not t.values:
            return 0.0
        return t.values[min(i, len(t.values) - 1)]

    crash = float(a.crash_round != b.crash_round)
    return sum(abs(at(a, i) - at(b, i)) for i in range(n)) / n + crash


def most_different(trajectories: Sequence[Trajectory], k: int) -> list[Trajectory]:
    """``k`` trajectories spread as far apart as possible (farthest-point selection, starting
    from the one shared by most combinations), in their original order."""
    if len(trajectories) <= k:
        return list(trajectories)
    chosen = [max(trajectories, key=lambda t: len(t.labels))]
    while len(chosen) < k:
        rest = [t for t in trajectories if t not in chosen]
        chosen.append(max(rest, key=lambda t: min(_distance(t, c) for c in chosen)))
    return [t for t in trajectories if t in chosen]


def pool_small_multiples(path: Path, trajectories: Sequence[Trajectory], *, title: str) -> Layout:
    """One small panel per distinct trajectory (at most :data:`MAX_PANELS`), shared axes; when
    there are more, a last panel summarises the rest as a min–max band with its median line.
    A crashed trajectory is red, with a cross at its crash round."""
    shown = most_different(trajectories, MAX_PANELS)
    rest = [t for t in trajectories if t not in shown]
    panels = len(shown) + (1 if rest else 0)
    cols = min(3, max(panels, 1))
    rows = -(-max(panels, 1) // cols)
    longest = max((len(t.values) for t in trajectories), default=1)
    with matplotlib.rc_context({**_RC, "font.size": 8}):
        lines = max((_title_lines(t) for t in shown), default=2)
        height = (1.8 + 0.15 * lines) * rows + 0.5
        fig = Figure(figsize=(3.3 * cols, height))
        # fixed spacing (room for the tallest panel title, never cut); constrained layout would
        # re-render the text several times
        fig.subplots_adjust(
            hspace=0.3 + 0.15 * lines, wspace=0.1, top=1 - (0.45 + 0.13 * lines) / height
        )
        grid = fig.subplots(rows, cols, sharex=True, sharey=True, squeeze=False)
        axes = [ax for row in grid for ax in row]
        for ax, t in zip(axes, shown, strict=False):
            colour = CRASHED if t.crash_round is not None else FINE
            xs = range(1, len(t.values) + 1)
            ax.plot(xs, [100 * v for v in t.values], color=colour, lw=1.4)
            name = wrap_title(t.title)
            if t.crash_round is not None:
                ax.plot([t.crash_round], [100], marker="X", color=CRASHED, markersize=8)
                name += f"\ncrashed in round {t.crash_round}"
            ax.set_title(name, loc="left", fontsize=7.5, color=colour)
        if rest:
            ax = axes[len(shown)]
            _summary_panel(ax, rest, longest)
        for ax in axes[panels:]:
            ax.set_visible(False)
        for ax in axes[:panels]:
            ax.set_ylim(0, 108)
            ax.xaxis.set_major_locator(MaxNLocator(integer=True, nbins=5))
            ax.grid(alpha=0.3)
        for row in grid:
            row[0].set_ylabel("pool in use (%)")
        for ax in grid[-1]:
            ax.set_xlabel("round")
        fig.suptitle(title, x=0.01, ha="left", fontsize=9)
        return _save(fig, path)


#: characters per line of a panel title (a 3.3-inch panel at 7.5 pt)
TITLE_CHARS = 44


def wrap_title(title: str, width: int = TITLE_CHARS) -> str:
    """``title`` on as many lines as it needs, broken after a ``/`` or a space where it can
    (a combo stays readable), never cut short."""
    lines: list[str] = []
    line = ""
    for piece in re.findall(r"[^/ ]*(?:/|\s+|$)", title):
        if not piece:
            continue
        if line and len(line) + len(piece.rstrip()) > width:
            lines.append(line.rstrip())
            line = ""
        while len(piece.rstrip()) > width:  # one word longer than a line: split it
            lines.append(piece[:width])
            piece = piece[width:]
        line += piece
    if line.strip():
        lines.append(line.rstrip())
    return "\n".join(lines)


def _title_lines(t: Trajectory) -> int:
    return wrap_title(t.title).count("\n") + 1 + (t.crash_round is not None)


def _summary_panel(ax, rest: Sequence[Trajectory], longest: int) -> None:
    """The trajectories not drawn on their own: the band they span and their median."""
    combos = sum(len(t.labels) for t in rest)
    lo, mid, hi = [], [], []
    for i in range(longest):
        at = sorted(100 * t.values[min(i, len(t.values) - 1)] for t in rest if t.values)
        if not at:
            break
        lo.append(at[0])
        hi.append(at[-1])
        mid.append(at[len(at) // 2])
    xs = list(range(1, len(mid) + 1))
    ax.fill_between(xs, lo, hi, color=SECOND, alpha=0.6, lw=0)
    ax.plot(xs, mid, color=FINE, lw=1.2)
    crashes = [t.crash_round for t in rest for _ in t.labels if t.crash_round is not None]
    for c in sorted(set(crashes)):
        ax.plot([c], [100], marker="X", color=CRASHED, markersize=6)
    note = f", {len(crashes)} crashed (×)" if crashes else ""
    ax.set_title(
        f"the other {combos} combinations:\nrange and median{note}", loc="left", fontsize=7.5
    )


#: a load-sweep cell's colour and legend words, by verdict
SWEEP_COLOURS = {
    "ok": ("#2e7d32", "completes"),
    "starved": ("#f9a825", "starves (a request waits > 1000 rounds)"),
    "oom": (CRASHED, "runs out of memory"),
    "failed": ("#9e9e9e", "unit failed"),
}


@dataclass(frozen=True)
class SweepRow:
    """Combinations with the same verdict at every load, and those verdicts."""

    labels: tuple[str, ...]
    verdicts: tuple[str, ...]
    #: per load: the round it ran out of memory in, or None
    crash_rounds: tuple[int | None, ...]

    @property
    def title(self) -> str:
        more = f"  (+{len(self.labels) - 1} alike)" if len(self.labels) > 1 else ""
        return self.labels[0] + more


def load_sweep_chart(
    path: Path, rows: Sequence[SweepRow], loads: Sequence[float], *, title: str
) -> Layout:
    """A grid: one row per group of combinations, one column per load; each cell says by its
    colour whether the combination completes, starves or runs out of memory there, so the
    first red or amber cell of a row is where that row stops coping."""
    with matplotlib.rc_context(_RC):
        fig = Figure(figsize=(7.5, max(1.8, 0.34 * len(rows) + 1.4)))
        ax = fig.add_subplot()
        for y, row in enumerate(rows):
            for x, (v, crash) in enumerate(zip(row.verdicts, row.crash_rounds, strict=True)):
                colour = SWEEP_COLOURS.get(v, SWEEP_COLOURS["failed"])[0]
                ax.add_patch(Rectangle((x - 0.45, y - 0.4), 0.9, 0.8, color=colour, lw=0))
                if crash is not None:
                    ax.text(x, y, f"OOM r{crash}", ha="center", va="center", color="white")
        ax.set_xlim(-0.5, len(loads) - 0.5)
        ax.set_ylim(len(rows) - 0.5, -0.5)
        ax.set_xticks(range(len(loads)), labels=[f"×{load:g}" for load in loads])
        ax.set_yticks(range(len(rows)), labels=[r.title for r in rows])
        ax.set_xlabel("load (arrival rate × the trace's)")
        ax.tick_params(length=0)
        for side in ("top", "right", "bottom", "left"):
            ax.spines[side].set_visible(False)
        used = {v for r in rows for v in r.verdicts}
        handles = [
            Patch(color=c, label=words) for v, (c, words) in SWEEP_COLOURS.items() if v in used
        ]
        ax.legend(
            handles=handles,
            loc="upper left",
            bbox_to_anchor=(0, -0.12 - 0.5 / (len(rows) + 2)),
            ncol=len(handles),
            frameon=False,
        )
        ax.set_title(title, loc="left")
        return _save(fig, path)


def ttft_by_load_chart(
    path: Path,
    series: Sequence[tuple[str, Sequence[float | None]]],
    loads: Sequence[float],
    *,
    title: str,
) -> Layout:
    """TTFT p99 (predicted seconds) against load, one line per group of combinations. The
    y axis is logarithmic and fitted to the data: the point is how far apart the lines are."""
    with matplotlib.rc_context(_RC):
        fig = Figure(figsize=(7.5, 3.2))
        ax = fig.add_subplot()
        for i, (label, values) in enumerate(series):
            xs = [x for x, v in zip(loads, values, strict=True) if v is not None]
            ys = [v for v in values if v is not None]
            ax.plot(xs, ys, marker="o", lw=1.4, label=label, zorder=3 + i)
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ax.yaxis.set_major_formatter(ScalarFormatter())
        ax.yaxis.set_minor_formatter(ScalarFormatter())
        ax.set_xticks(list(loads), labels=[f"×{load:g}" for load in loads])
        ax.set_xlabel("load (arrival rate × the trace's)")
        ax.set_ylabel("TTFT p99, predicted s")
        ax.grid(alpha=0.3, which="both")
        ax.legend(loc="upper left", fontsize=7)
        ax.set_title(title, loc="left")
        return _save(fig, path)
