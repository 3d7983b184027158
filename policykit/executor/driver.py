"""Driving a sweep: feed units to an executor, retry failures, keep what finished.

The driver owns the policy every executor shares: a failed attempt (the unit raised, its
worker died, it timed out) is retried up to ``retries`` times, and the unit is reported
failed with every attempt's reason when the last one fails too. Ctrl-C (``KeyboardInterrupt``)
cancels what is running and returns the results so far, the rest marked missing, so a long
sweep interrupted at 90 % still leaves 90 % of a results file.
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Sequence
from datetime import UTC, datetime
from typing import Protocol

from policykit.executor.base import Executor
from policykit.executor.results import SweepResults
from policykit.executor.work import Attempt, Status, Unit, UnitResult

#: how long one collect() waits before the driver looks at its queue again
_POLL_SECONDS = 0.2


class Listener(Protocol):
    """Told about progress; the rich progress bar is one."""

    def attempt_ended(self, attempt: Attempt, result: UnitResult | None) -> None:
        """``result`` is the unit's final result, or ``None`` when it will be retried."""


def run_units(
    units: Sequence[Unit],
    executor: Executor,
    *,
    retries: int = 1,
    listener: Listener | None = None,
) -> SweepResults:
    """Run every unit on ``executor``; return the results in the order of ``units``."""
    ids = [u.id for u in units]
    if len(set(ids)) != len(ids):
        raise ValueError("unit ids must be unique within a sweep")
    by_id = {u.id: u for u in units}
    results = {u.id: UnitResult(u, Status.MISSING, executor=executor.name) for u in units}
    queue: deque[Unit] = deque(units)
    created = datetime.now(UTC).isoformat(timespec="seconds")
    started = time.perf_counter()
    interrupted = False
    try:
        while queue or executor.busy():
            _submit_while_room(queue, executor, results)
            for attempt in executor.collect(_POLL_SECONDS):
                result = results[attempt.unit_id]
                final = _record(result, attempt, retries)
                if not final:
                    queue.appendleft(by_id[attempt.unit_id])
                if listener is not None:
                    listener.attempt_ended(attempt, result if final else None)
    except KeyboardInterrupt:
        interrupted = True
        executor.cancel()
    return SweepResults(
        executor=executor.describe(),
        units=[results[i] for i in ids],
        created=created,
        wall_seconds=time.perf_counter() - started,
        interrupted=interrupted,
    )


def _submit_while_room(
    queue: deque[Unit], executor: Executor, results: dict[str, UnitResult]
) -> None:
    """Start queued units in order while the executor has room for their kind (CPU or GPU);
    a kind without room is not asked again this pass, so a long queue costs little."""
    full: set[bool] = set()
    for unit in list(queue):
        if len(full) == 2:
            break
        if unit.gpu in full:
            continue
        if not executor.has_room(unit):
            full.add(unit.gpu)
            continue
        queue.remove(unit)
        results[unit.id].attempts += 1
        executor.submit(unit)


def _record(result: UnitResult, attempt: Attempt, retries: int) -> bool:
    """Fold one attempt into the unit's result; whether the result is final."""
    result.node, result.host = attempt.node, attempt.host
    if attempt.ok:
        result.status = Status.OK
        result.result = attempt.result
        result.wall_seconds, result.cpu_seconds = attempt.wall_seconds, attempt.cpu_seconds
        return True
    result.errors.append(attempt.error or "unknown failure")
    if result.attempts > retries:
        result.status = Status.FAILED
        return True
    return False
