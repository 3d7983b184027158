"""Progress of one long scheduler run: requests done, rounds, ETA.

A trace replay runs thousands of rounds. On a terminal a rich bar on stderr shows it (and goes
away when the run ends, so the run's own output stays clean); in a log, a
:class:`~policykit.heartbeat.Heartbeat` line comes every 10 s once the run has lasted that long
(a short run, most of them, writes nothing).
"""

from __future__ import annotations

import sys
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

from policykit.heartbeat import INTERVAL_S, Heartbeat
from policykit.node import PrefillNode
from policykit.plan import NEVER
from policykit.request import State
from policykit.scheduler import RoundRecord


class RunProgress:
    """Pass :meth:`on_round` to :meth:`Scheduler.run <policykit.scheduler.Scheduler.run>`."""

    def __init__(
        self,
        node: PrefillNode,
        label: str = "simulate",
        *,
        stream: TextIO | None = None,
        interval: float = INTERVAL_S,
    ) -> None:
        self.node = node
        self.total = len(node.requests)
        #: requests that will not come back: finished, failed or refused for good
        self.done = 0
        self.rounds = 0
        self.interval = interval
        self._t0 = time.monotonic()
        stream = stream or sys.stderr
        isatty = getattr(stream, "isatty", None)
        self._tty = bool(isatty and isatty())
        self._bar = Progress(
            TextColumn("[bold]{task.description}"),
            BarColumn(),
            MofNCompleteColumn(),
            TextColumn("requests, {task.fields[rounds]} rounds"),
            TimeElapsedColumn(),
            TextColumn("ETA"),
            TimeRemainingColumn(),
            console=Console(file=stream),
            transient=True,
            disable=not self._tty,
        )
        self._task = self._bar.add_task(label, total=self.total, rounds=0)
        self._beat = Heartbeat(f"{label}: requests", self.total, stream=stream, interval=interval)
        self._beating = False

    def on_round(self, record: RoundRecord) -> None:
        """Count what the round ended for good, and redraw."""
        self.rounds = record.plan.round
        self.done += sum(e.kind.finishes for e in record.plan.entries)
        self.done += len(record.failed)
        self.done += sum(r.verdict == NEVER for r in record.plan.rejected)
        requests = self.node.requests
        self.done += sum(requests[i].state is State.REJECTED for i in record.arrived)
        self._bar.update(self._task, completed=self.done, rounds=self.rounds)
        beat = self._beat
        beat.done = self.done
        beat.describe(f"round {self.rounds}, ETA {self.eta()}")
        if not self._beating and time.monotonic() - self._t0 >= self.interval:
            self._beating = True
            beat.__enter__()
            if beat.active:
                print(beat.line(), file=beat.stream, flush=True)

    def eta(self) -> str:
        """Seconds left at the pace so far (``?`` before anything is done)."""
        if not self.done:
            return "?"
        elapsed = time.monotonic() - self._t0
        return f"{elapsed / self.done * (self.total - self.done):.0f} s"

    def __enter__(self) -> Self:
        self._bar.start()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        if self._beating:
            self._beat.__exit__(exc_type, exc, tb)
        self._bar.stop()
