"""Progress of long work, for a person watching it: what runs now, how far it is (done/total),
how long it has run and the ETA, as a bar on stderr.

Only a person at a terminal reads a bar: written to a log it is either nothing until the end
or thousands of control sequences, and ``--json`` output is read by a program. So
:class:`ProgressBar` draws only where :func:`shown` says a person watches (stderr a terminal,
not ``--json``, ``CI`` not set) and prints nothing elsewhere. Every long command draws its
progress through it; what counts as done is the caller's (requests of a run, units of a sweep,
combos of a check, steps of the docs).

A command that runs another in a process of its own (``docs`` runs ``check --all --json``)
would show only "1 step" for it. So :func:`run_relayed` sets :data:`RELAY_ENV` for the child:
the child's bars then write each count as one line on its stderr (whatever its stream and
mode), and the parent's bar takes those lines (:meth:`ProgressBar.follow`) and keeps the rest.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
from types import TracebackType
from typing import IO, Self, TextIO

from rich.console import Console
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    TextColumn,
    TimeElapsedColumn,
    TimeRemainingColumn,
)

#: set (to anything) in a child's environment: its bars relay their counts on stderr
RELAY_ENV = "POLICYKIT_PROGRESS_RELAY"
#: how a relayed line starts; the rest is a JSON object (``done``, ``total``, ``now``)
RELAY_PREFIX = "policykit-progress: "
#: values of ``CI`` that mean "not CI" (a user may export ``CI=0`` to see the bars again)
_NOT_CI = ("", "0", "false", "no")


def is_terminal(stream: TextIO) -> bool:
    isatty = getattr(stream, "isatty", None)
    return bool(isatty is not None and isatty())


def shown(stream: TextIO, *, quiet: bool) -> bool:
    """Whether a person watches ``stream``: it is a terminal, the command is not ``quiet``
    (``--json``: a program reads the output) and this is not a CI job (``CI`` set, as CI
    services do, whose log keeps every redraw)."""
    in_ci = os.environ.get("CI", "").strip().lower() not in _NOT_CI
    return not quiet and not in_ci and is_terminal(stream)


class ProgressBar:
    """``with ProgressBar("bench", 80, unit="runs", quiet=as_json) as bar: bar.advance();
    bar.describe(x)``.

    Where :func:`shown`: a rich bar on ``stream`` (label, bar, done/total ``unit``, elapsed,
    ETA, what runs now), transient unless told to stay, and with ``summary`` a last line saying
    how long it took. Under :data:`RELAY_ENV`: one line per count on ``stream`` instead.
    Elsewhere nothing. ``total`` 0 is "not known yet" (no ETA until it is set).
    """

    def __init__(
        self,
        label: str,
        total: int,
        *,
        unit: str = "",
        stream: TextIO | None = None,
        quiet: bool = False,
        transient: bool = True,
        summary: bool = False,
    ) -> None:
        self.label = label
        self.summary = summary
        self.stream = stream or sys.stderr
        self._total, self._done, self._current = total, 0, ""
        self._t0 = time.monotonic()
        self._relay = bool(os.environ.get(RELAY_ENV))
        #: whether a bar is drawn (a parent relays a child's counts only into a drawn bar)
        self.shown = not self._relay and shown(self.stream, quiet=quiet)
        self._bar = Progress(
            TextColumn("[bold]{task.description}"),
            BarColumn(),
            MofNCompleteColumn(),
            TextColumn(unit),
            TimeElapsedColumn(),
            TextColumn("ETA"),
            TimeRemainingColumn(),
            TextColumn("{task.fields[now]}"),
            console=Console(file=self.stream),
            transient=transient,
            disable=not self.shown,
        )
        self._task = self._bar.add_task(label, total=total or None, now="")

    @property
    def total(self) -> int:
        return self._total

    @total.setter
    def total(self, value: int) -> None:
        changed, self._total = value != self._total, value
        self._bar.update(self._task, total=value or None)
        self._relay_count(changed)

    @property
    def done(self) -> int:
        return self._done

    @done.setter
    def done(self, value: int) -> None:
        changed, self._done = value != self._done, value
        self._bar.update(self._task, completed=value)
        self._relay_count(changed)

    @property
    def current(self) -> str:
        """What runs now (the last :meth:`describe`)."""
        return self._current

    def advance(self, n: int = 1) -> None:
        self.done = self._done + n

    def describe(self, current: str) -> None:
        """What runs now, shown after the bar (relayed with the next count)."""
        self._current = current
        self._bar.update(self._task, now=current)

    def follow(self, line: str) -> bool:
        """Take a count a child relayed (one line of its stderr) into this bar; False, and
        nothing changed, for any other line."""
        if not line.startswith(RELAY_PREFIX):
            return False
        try:
            count = json.loads(line[len(RELAY_PREFIX) :])
            total, done, now = int(count["total"]), int(count["done"]), str(count["now"])
        except (ValueError, TypeError, KeyError):
            return False
        self.describe(now)
        self.total, self.done = total, done
        return True

    def _relay_count(self, changed: bool) -> None:
        """Relay a count that changed (a run sets its count every round, thousands a second,
        and most rounds finish nothing)."""
        if self._relay and changed:
            count = {"done": self._done, "total": self._total, "now": self._current}
            print(RELAY_PREFIX + json.dumps(count), file=self.stream, flush=True)

    def __enter__(self) -> Self:
        self._bar.start()
        self._relay_count(True)  # the total, before the first thing is done
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self._bar.stop()
        if self.shown and self.summary and exc_type is None:
            took = time.monotonic() - self._t0
            print(f"{self.label}: done in {took:.0f} s", file=self.stream)


def run_relayed(argv: list[str], bar: ProgressBar) -> subprocess.CompletedProcess[str]:
    """``subprocess.run(argv, capture_output=True, text=True)``, with the child's progress in
    ``bar``: where the bar is drawn the child relays its counts (:data:`RELAY_ENV`), which
    ``bar`` takes; its other stderr lines are kept as the result's ``stderr``."""
    env = {**os.environ, RELAY_ENV: "1"} if bar.shown else None
    with subprocess.Popen(
        argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env
    ) as proc:
        assert proc.stdout is not None and proc.stderr is not None  # (both are pipes)
        out: list[str] = []
        # stdout drains beside stderr: a child blocked on a full stdout pipe would never end
        reader = threading.Thread(target=_read_all, args=(proc.stdout, out), daemon=True)
        reader.start()
        err = [line for line in proc.stderr if not bar.follow(line)]
        reader.join()
        code = proc.wait()
    return subprocess.CompletedProcess(argv, code, "".join(out), "".join(err))


def _read_all(stream: IO[str], into: list[str]) -> None:
    into.append(stream.read())
