"""Progress of one long scheduler run: requests done, the round, the ETA.

A trace replay runs thousands of rounds. :class:`~policykit.progress.ProgressBar` draws it: a
bar on a terminal that goes away when the run ends (so the run's own output stays clean), and
nothing under ``--json``, in a log or in CI. What this module owns is what counts as done: a
request that will not come back.
"""

from __future__ import annotations

from types import TracebackType
from typing import Self, TextIO

from policykit.node import PrefillNode
from policykit.plan import NEVER
from policykit.progress import ProgressBar
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
        quiet: bool = False,
    ) -> None:
        self.node = node
        self.rounds = 0
        self.bar = ProgressBar(
            label,
            len(node.requests),
            unit="requests",
            stream=stream,
            quiet=quiet,
        )

    @property
    def done(self) -> int:
        """Requests that will not come back: finished, failed or refused for good."""
        return self.bar.done

    @property
    def total(self) -> int:
        return self.bar.total

    def on_round(self, record: RoundRecord) -> None:
        """Count what the round ended for good, and redraw."""
        self.rounds = record.plan.round
        ended = sum(e.kind.finishes for e in record.plan.entries)
        ended += len(record.failed)
        ended += sum(r.verdict == NEVER for r in record.plan.rejected)
        requests = self.node.requests
        ended += sum(requests[i].state is State.REJECTED for i in record.arrived)
        self.bar.describe(f"round {self.rounds}")
        self.bar.advance(ended)

    def __enter__(self) -> Self:
        self.bar.__enter__()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.bar.__exit__(exc_type, exc, tb)
