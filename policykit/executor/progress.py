"""A sweep's progress: units done, and how many each node has finished.

Drawn by :class:`~policykit.progress.ProgressBar`: a bar on stderr that stays when the sweep
ends, on a terminal only and not under ``--json`` (nothing in a log or in CI).
"""

from __future__ import annotations

from collections import Counter
from types import TracebackType
from typing import Self

from policykit.executor.work import Attempt, Status, UnitResult
from policykit.progress import ProgressBar


class SweepProgress:
    """A :class:`~policykit.executor.driver.Listener` that counts units per node."""

    def __init__(self, total: int, *, label: str = "units", quiet: bool = False):
        self.per_node: Counter[str] = Counter()
        self.failed = 0
        self.retried = 0
        self._bar = ProgressBar(label, total, unit="units", transient=False, quiet=quiet)

    def attempt_ended(self, attempt: Attempt, result: UnitResult | None) -> None:
        if result is None:
            self.retried += 1
        else:
            self.per_node[attempt.host or "?"] += 1
            self.failed += result.status is Status.FAILED
            self._bar.advance()
        self._bar.describe(f"{attempt.unit_id} {self.status_line()}")

    def status_line(self) -> str:
        nodes = " · ".join(f"{host} {n}" for host, n in sorted(self.per_node.items()))
        extra = []
        if self.retried:
            extra.append(f"{self.retried} retried")
        if self.failed:
            extra.append(f"{self.failed} failed")
        return " ".join([nodes, *extra])

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
