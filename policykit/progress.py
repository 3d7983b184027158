"""Progress of long work: a bar on a terminal, a plain line at least every 10 s in a log.

A bar redraws one terminal line; written to a CI log it is either nothing until the end or
thousands of control sequences. So :class:`ProgressBar` draws a rich bar on stderr only when
that is a terminal (what runs, how far, for how long, the ETA), and a :class:`Heartbeat` prints
one plain line at a fixed interval from a background thread otherwise, so that a single slow
unit (one combo's proof, one long replay) still shows the run is alive. Every command that
runs for long draws its progress through :class:`ProgressBar`; what counts as done is the
caller's (requests of a run, units of a sweep, steps of the docs).
"""

from __future__ import annotations

import sys
import threading
import time
from types import TracebackType
from typing import Self, TextIO

from rich.console import Console
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    TextColumn,
    TimeElapsedColumn,
    TimeRemainingColumn,
)

#: seconds between two lines; the promise is "at least every 10 s"
INTERVAL_S = 10.0


def is_terminal(stream: TextIO) -> bool:
    isatty = getattr(stream, "isatty", None)
    return bool(isatty is not None and isatty())


class Heartbeat:
    """``label: 3/80 done, 41 s — sglang/sglang/page`` every ``interval`` seconds.

    Silent when ``stream`` is a terminal (a bar is drawn there instead) or ``enabled`` is false.
    With ``quiet_if_short``, work that ends before the first line leaves no last line either.
    """

    def __init__(
        self,
        label: str,
        total: int,
        *,
        stream: TextIO | None = None,
        interval: float = INTERVAL_S,
        enabled: bool = True,
        quiet_if_short: bool = False,
    ) -> None:
        self.label, self.total, self.interval = label, total, interval
        self.stream = stream or sys.stderr
        self.done = 0
        self.current = ""
        self.quiet_if_short = quiet_if_short
        self.lines = 0
        self._t0 = time.monotonic()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.active = enabled and not is_terminal(self.stream)

    def advance(self, n: int = 1) -> None:
        self.done += n

    def describe(self, current: str) -> None:
        """What is being worked on now (shown after the count)."""
        self.current = current

    def line(self) -> str:
        elapsed = time.monotonic() - self._t0
        now = f" — {self.current}" if self.current else ""
        return f"{self.label}: {self.done}/{self.total} done, {elapsed:.0f} s{now}"

    def _print(self) -> None:
        self.lines += 1
        print(self.line(), file=self.stream, flush=True)

    def _beat(self) -> None:
        while not self._stop.wait(self.interval):
            self._print()

    def __enter__(self) -> Self:
        if self.active:
            self._thread = threading.Thread(target=self._beat, name="heartbeat", daemon=True)
            self._thread.start()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
            if exc_type is None and (self.lines or not self.quiet_if_short):
                self.current = ""
                self._print()


class ProgressBar:
    """``with ProgressBar("bench", 80, unit="runs") as bar: bar.advance(); bar.describe(x)``.

    On a terminal: a rich bar on ``stream`` (label, bar, done/total ``unit``, elapsed, ETA,
    what runs now), transient unless told to stay, and with ``summary`` a last line saying how
    long it took. Elsewhere: the :class:`Heartbeat`'s lines. ``enabled=False`` draws nothing.
    """

    def __init__(
        self,
        label: str,
        total: int,
        *,
        unit: str = "",
        stream: TextIO | None = None,
        interval: float = INTERVAL_S,
        enabled: bool = True,
        transient: bool = True,
        summary: bool = False,
        quiet_if_short: bool = False,
    ) -> None:
        self.label = label
        self.summary = summary
        self._t0 = time.monotonic()
        stream = stream or sys.stderr
        self._beat = Heartbeat(
            label,
            total,
            stream=stream,
            interval=interval,
            enabled=enabled,
            quiet_if_short=quiet_if_short,
        )
        self._tty = enabled and is_terminal(stream)
        self._bar = Progress(
            TextColumn("[bold]{task.description}"),
            BarColumn(),
            MofNCompleteColumn(),
            TextColumn(unit),
            TimeElapsedColumn(),
            TextColumn("ETA"),
            TimeRemainingColumn(),
            TextColumn("{task.fields[now]}"),
            console=Console(file=stream),
            transient=transient,
            disable=not self._tty,
        )
        self._task = self._bar.add_task(label, total=total or None, now="")

    @property
    def total(self) -> int:
        return self._beat.total

    @total.setter
    def total(self, value: int) -> None:
        self._beat.total = value
        self._bar.update(self._task, total=value or None)

    @property
    def done(self) -> int:
        return self._beat.done

    @done.setter
    def done(self, value: int) -> None:
        self._beat.done = value
        self._bar.update(self._task, completed=value)

    @property
    def current(self) -> str:
        return self._beat.current

    def advance(self, n: int = 1) -> None:
        self.done = self._beat.done + n

    def describe(self, current: str) -> None:
        """What runs now: after the bar on a terminal, after the count in a log line."""
        self._beat.describe(current)
        self._bar.update(self._task, now=current)

    def __enter__(self) -> Self:
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
        self._bar.stop()
        if self._tty and self.summary and exc_type is None:
            took = time.monotonic() - self._t0
            print(f"{self.label}: done in {took:.0f} s", file=self._beat.stream)
