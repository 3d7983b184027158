"""One rich progress bar over all units of a sweep, with how many each node has finished.

It draws on stderr, so ``--json -`` output on stdout stays clean; rich draws nothing live when
stderr is not a terminal (CI logs get no bar spam): there a :class:`~policykit.heartbeat.Heartbeat`
prints a plain line at least every 10 s instead.
"""

from __future__ import annotations

from collections import Counter
from types import TracebackType
from typing import Self

from rich.console import Console
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    TextColumn,
    TimeElapsedColumn,
)

from policykit.executor.work import Attempt, Status, UnitResult
from policykit.heartbeat import Heartbeat


class SweepProgress:
    """A :class:`~policykit.executor.driver.Listener` that draws the bar."""

    def __init__(self, total: int, *, label: str = "units", console: Console | None = None):
        self.per_node: Counter[str] = Counter()
        self.failed = 0
        self.retried = 0
        self._progress = Progress(
            TextColumn("[bold]{task.description}"),
            BarColumn(),
            MofNCompleteColumn(),
            TimeElapsedColumn(),
            TextColumn("{task.fields[status]}"),
            console=console or Console(stderr=True),
            transient=False,
        )
        self._task = self._progress.add_task(label, total=total, status="")
        # a log (stderr not a terminal) gets a plain line at least every 10 s instead
        self._heartbeat = Heartbeat(label, total)

    def attempt_ended(self, attempt: Attempt, result: UnitResult | None) -> None:
        if result is None:
            self.retried += 1
        else:
            self.per_node[attempt.host or "?"] += 1
            self.failed += result.status is Status.FAILED
        self._progress.update(self._task, advance=result is not None, status=self.status_line())
        if result is not None:
            self._heartbeat.advance()
            self._heartbeat.describe(attempt.unit_id)

    def status_line(self) -> str:
        nodes = " · ".join(f"{host} {n}" for host, n in sorted(self.per_node.items()))
        extra = []
        if self.retried:
            extra.append(f"[yellow]{self.retried} retried[/]")
        if self.failed:
            extra.append(f"[red]{self.failed} failed[/]")
        return " ".join([nodes, *extra])

    def __enter__(self) -> Self:
        self._progress.start()
        self._heartbeat.__enter__()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self._heartbeat.__exit__(exc_type, exc, tb)
        self._progress.stop()
