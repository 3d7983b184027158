"""Progress of one step of ``policykit docs``: a bar on a terminal, a line every 10 s in a log.

The docs run for minutes (the checker, the harness, trace replays, mkdocs). A
:class:`~policykit.heartbeat.Heartbeat` keeps a log alive but is silent on a terminal, where a
person watching saw nothing for minutes; :class:`Step` draws a rich bar there instead (what is
running, how far, for how long), and falls back to the heartbeat's plain lines elsewhere. It has
the heartbeat's interface, so a step that counts work updates both the same way.
"""

from __future__ import annotations

import sys
from types import TracebackType
from typing import Self

from rich.console import Console
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    SpinnerColumn,
    TextColumn,
    TimeElapsedColumn,
)

from policykit.heartbeat import Heartbeat


class Step:
    """``with Step("policykit docs: mkdocs build", 1) as step: ...; step.advance()``."""

    def __init__(self, label: str, total: int, *, console: Console | None = None) -> None:
        self._beat = Heartbeat(label, total)
        self._console = console or Console(stderr=True)
        self._bar: Progress | None = None
        if self._console.is_terminal and not self._beat.active:
            self._bar = Progress(
                SpinnerColumn(),
                TextColumn("[bold]{task.description}"),
                BarColumn(),
                MofNCompleteColumn(),
                TimeElapsedColumn(),
                TextColumn("{task.fields[now]}"),
                console=self._console,
                transient=True,
            )
            self._task = self._bar.add_task(label, total=total or None, now="")

    @property
    def total(self) -> int:
        return self._beat.total

    @total.setter
    def total(self, value: int) -> None:
        self._beat.total = value
        if self._bar is not None:
            self._bar.update(self._task, total=value or None)

    @property
    def done(self) -> int:
        return self._beat.done

    @done.setter
    def done(self, value: int) -> None:
        self._beat.done = value
        if self._bar is not None:
            self._bar.update(self._task, completed=value)

    @property
    def current(self) -> str:
        return self._beat.current

    def advance(self, n: int = 1) -> None:
        self.done = self._beat.done + n

    def describe(self, current: str) -> None:
        self._beat.describe(current)
        if self._bar is not None:
            self._bar.update(self._task, now=current)

    def __enter__(self) -> Self:
        if self._bar is not None:
            self._bar.start()
        self._beat.__enter__()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self._beat.__exit__(exc_type, exc, tb)
        if self._bar is not None:
            self._bar.stop()
            if exc_type is None:
                elapsed = self._bar.tasks[0].elapsed or 0.0
                print(f"{self._beat.label}: done in {elapsed:.0f} s", file=sys.stderr)
