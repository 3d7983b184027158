"""Terminal rendering of a run: one row per scheduling decision, like the A/B/C table of
docs/incidents.md#truncated-tail.

Every table the commands print goes through :func:`fold` so that, at 80 columns, a cell that
does not fit wraps onto the next line instead of being cut to ``trunc…``.
"""

from __future__ import annotations

import os
import re

from rich import box
from rich.console import Console, ConsoleOptions, RenderResult
from rich.table import Column, Table
from rich.text import Text

from policykit.plan import EntryKind
from policykit.scheduler import RunResult

_KIND_STYLE = {
    EntryKind.WHOLE: "green",
    EntryKind.FINAL: "green",
    EntryKind.TRUNCATED: "yellow",
    EntryKind.RESUMED: "yellow",
    EntryKind.DEFERRED: "magenta",
}


#: inline reST a docstring may use: ``literal``, :role:`~dotted.Target` and *emphasis*
_REST_INLINE = re.compile(
    r"``(?P<literal>.+?)``|:[a-z]+:`~?(?P<role>[^`]+)`|(?<![*\w])\*(?P<em>[^*\s][^*]*)\*(?!\*)"
)


def rest_text(text: str) -> Text:
    """A docstring's inline reST as styled terminal text, the markup itself removed.

    ``literal`` prints as code (bold cyan), a cross-reference as the last part of its dotted
    name (``:class:`~policykit.allocator.AllocatorFacade``` -> ``AllocatorFacade``), *emphasis*
    in italics.
    """
    out = Text()
    pos = 0
    for m in _REST_INLINE.finditer(text):
        out.append(text[pos : m.start()])
        if m.group("literal") is not None:
            out.append(m.group("literal"), style="bold cyan")
        elif m.group("role") is not None:
            out.append(m.group("role").rsplit(".", 1)[-1].removesuffix("()"), style="bold cyan")
        else:
            out.append(m.group("em"), style="italic")
        pos = m.end()
    out.append(text[pos:])
    return out


def fold(table: Table) -> Table:
    """``table`` made to fit a narrow terminal: cells wrap (``fold``), never end in ``…``, and
    the lighter box spends two columns per cell instead of three.

    A column whose every cell is one word (a number, a ``[start,end)`` range, a combo) keeps
    its values whole where the width allows: the columns with prose give up the room, since a
    number folded mid-value (``[86784,89280`` / ``)``) reads as another number."""
    table.box = box.SIMPLE_HEAD
    table.pad_edge = False
    table.padding = (0, 1, 0, 0)
    for column in table.columns:
        column.overflow = "fold"
        column.no_wrap = False
    table.__class__ = _FoldedTable
    return table


class _FoldedTable(Table):
    """A :class:`Table` whose one-word columns are as wide as their longest value, unless that
    would not fit the width at all (then everything folds, rather than be cut off)."""

    def __rich_console__(self, console: Console, options: ConsoleOptions) -> RenderResult:
        words = {i: w for i, c in enumerate(self.columns) if (w := _widest_word(c)) is not None}
        kept = [c.min_width for c in self.columns]
        for i, widest in words.items():
            self.columns[i].min_width = max(kept[i] or 0, widest)
        if self.__rich_measure__(console, options).minimum > options.max_width:
            for column, width in zip(self.columns, kept, strict=True):
                column.min_width = width
        try:
            yield from super().__rich_console__(console, options)
        finally:
            for column, width in zip(self.columns, kept, strict=True):
                column.min_width = width


def _widest_word(column: Column) -> int | None:
    """The length of the longest cell of ``column`` when every cell is a single word, else
    None (a cell with a space in it, or one that is not text, may wrap)."""
    widest = 0
    for cell in column.cells:
        text = cell.plain if isinstance(cell, Text) else cell
        if not isinstance(text, str) or any(ch.isspace() for ch in text.strip()):
            return None
        widest = max(widest, len(text.strip()))
    return widest or None


def rounds_table(result: RunResult, title: str) -> Table:
    table = Table(title=title, title_justify="left", header_style="bold")
    table.add_column("round", justify="right")
    table.add_column("request")
    table.add_column("chunk\n[start,end)", justify="right")
    table.add_column("tokens", justify="right")
    table.add_column("kind")
    table.add_column("load-\nback", justify="right")
    table.add_column("rem_\ntotal", justify="right")
    table.add_column("cur_\nrem", justify="right")
    table.add_column("free\nafter", justify="right")
    for record in result.rounds:
        plan = record.plan
        marks = {m.request_id: m for m in plan.marks}
        rows: list[list[str | Text]] = []
        for entry in plan.entries:
            mark = marks.get(entry.request_id) if entry.kind is not EntryKind.DEFERRED else None
            rows.append(
                [
                    entry.request_id,
                    f"[{entry.start},{entry.end})" if entry.tokens else "-",
                    str(entry.tokens),
                    Text(entry.kind.value, style=_KIND_STYLE[entry.kind]),
                    str(entry.load_back) if entry.load_back else "",
                    "" if mark is None else str(mark.rem_total_tokens),
                    "" if mark is None else str(mark.cur_rem_tokens),
                ]
            )
        for rej in plan.rejected:
            rows.append(
                [rej.request_id, "-", "", Text(f"rejected {rej.verdict}", style="red"), "", "", ""]
            )
        if not rows:
            rows.append([Text("(nothing to do)", style="dim"), "", "", "", "", "", ""])
        oom_round = result.oom is not None and result.oom.round == plan.round
        after = Text("OOM", style="bold red") if oom_round else str(record.free_tokens_after)
        for i, row in enumerate(rows):
            last = i == len(rows) - 1
            table.add_row(str(plan.round) if i == 0 else "", *row, after if last else "")
        table.add_section()
    return fold(table)


def default_console(*, stderr: bool = False, piped_width: int = 120) -> Console:
    """A console of the terminal's width; when output is piped and ``COLUMNS`` is not set,
    ``piped_width`` columns (a log is read in an editor, not squeezed to 80)."""
    console = Console(stderr=stderr)
    if not console.is_terminal and "COLUMNS" not in os.environ:
        console = Console(stderr=stderr, width=piped_width)
    return console


def print_run(result: RunResult, *, title: str, console: Console | None = None) -> None:
    """The per-round table, then the verdict: OOM with the engine's message, or no OOM."""
    console = console or default_console()
    console.print(rounds_table(result, title))
    if result.oom is not None:
        who = f" while placing {result.oom.request}" if result.oom.request else ""
        console.print(Text(f"OOM in round {result.oom.round}{who}:", style="bold red"))
        console.print(Text(result.oom.message, style="red"))
    if result.never_completes is not None:
        nc = result.never_completes
        console.print(
            Text(
                f"Admitted request {nc.request} can never complete (round {nc.round}, {nc.cause}):",
                style="bold red",
            )
        )
        console.print(Text(nc.message, style="red"))
    if result.starvation is not None:
        st = result.starvation
        console.print(
            Text(f"Waiting request {st.request} starves (round {st.round}):", style="bold red")
        )
        console.print(Text(st.message, style="red"))
    if result.oom is None:
        console.print(
            Text(
                f"No OOM after {len(result.rounds)} rounds (stopped: {result.stopped_by}).",
                style="bold green"
                if result.never_completes is None and result.starvation is None
                else "yellow",
            )
        )
    console.print(f"completed: {', '.join(result.completed) or '-'}")
    console.print(f"pending:   {', '.join(result.pending) or '-'}")
    if result.rejected:
        for rid, reason in result.rejected.items():
            console.print(f"rejected:  {rid}: {reason}")
    for rid, reason in result.failed.items():
        console.print(Text(f"failed:    {rid}: {reason}", style="red"))
    if result.starved:
        for rid, waited in result.starved.items():
            console.print(Text(f"starved:   {rid} waited {waited} rounds", style="yellow"))
