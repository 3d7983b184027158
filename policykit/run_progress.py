"""Progress of one long scheduler run: requests done, rounds, ETA.

A trace replay runs thousands of rounds. :class:`~policykit.progress.ProgressBar` draws it: a
bar on a terminal that goes away when the run ends (so the run's own output stays clean), a
line every 10 s in a log once the run has lasted that long (a short run, most of them, writes
nothing). What this module owns is what counts as done: a request that will not come back.
"""

from __future__ import annotations

import time
from types import TracebackType
from typing import Self, TextIO

from policykit.node import PrefillNode
from policykit.plan import NEVER
from policykit.progress import INTERVAL_S, ProgressBar
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
        self._t0 = time.monotonic()
        self._bar = ProgressBar(
            f"{label}: requests",
            self.total,
            unit="requests",
            stream=stream,
            interval=interval,
            quiet_if_short=True,
        )
        self._bar.describe("round 0, ETA ?")

    def on_round(self, record: RoundRecord) -> None:
        """Count what the round ended for good, and redraw."""
        self.rounds = record.plan.round
        self.done += sum(e.kind.finishes for e in record.plan.entries)
        self.done += len(record.failed)
        self.done += sum(r.verdict == NEVER for r in record.plan.rejected)
        requests = self.node.requests
        self.done += sum(requests[i].state is State.REJECTED for i in record.arrived)
        self._bar.done = self.done
        self._bar.describe(f"round {self.rounds}, ETA {self.eta()}")

    def eta(self) -> str:
        """Seconds left at the pace so far (``?`` before anything is done)."""
        if not self.done:
            return "?"
        elapsed = time.monotonic() - self._t0
        return f"{elapsed / self.done * (self.total - self.done):.0f} s"

    def __enter__(self) -> Self:
        self._bar.__enter__()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self._bar.__exit__(exc_type, exc, tb)
