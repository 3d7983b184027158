"""Each combo checked in a fresh process forked from one that never ran z3: same answer,
whatever was checked before it, on however many cores.

A resource budget makes z3's answers independent of the clock, but not of the process: z3's
search depends on where its terms lie in memory (measured: one obligation, solved again and
again in one process between unrelated allocations, spent 39 252, 39 253, 39 274, 39 426 or
39 427 units, and an unrolled query found a different counterexample after another combo had
been checked in the same process). So no combo is checked where another one was. A *zygote*
is forked first, before any z3 work or progress thread; it forks one child per combo (at most
``jobs`` at a time), each child checks its combo and writes its rows to a file, and exits. Every
child starts from the zygote's memory, which nothing changes between forks, so a combo's
verdicts and counterexample are the same with ``--jobs 1`` or ``--jobs 8``, first or last, in a
test or on the command line.
"""

from __future__ import annotations

import contextlib
import os
import pickle
import shutil
import signal
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

#: checks one combo (by its index) and returns its rows; runs in a forked child
Job = Callable[[int], list[dict[str, Any]]]


def run_isolated(count: int, job: Job, jobs: int) -> Iterator[tuple[int, list[dict[str, Any]]]]:
    """Run ``job(i)`` for ``i`` in ``range(count)``, each in a child of the zygote, at most
    ``jobs`` at once; yield ``(i, rows)`` as each finishes (in the order they finish). The
    zygote is forked now, before the caller starts any thread (a progress bar)."""
    folder = Path(tempfile.mkdtemp(prefix="policykit-check-"))
    read_end, write_end = os.pipe()
    zygote = os.fork()
    if zygote == 0:  # pragma: no cover - runs in the forked zygote
        os.close(read_end)
        os.setpgid(0, 0)  # one process group with its children, to stop them together
        code = 0
        try:
            _zygote(count, job, max(1, jobs), folder, write_end)
        except BaseException:  # the parent sees the missing results
            code = 1
        os._exit(code)
    os.close(write_end)
    return _results(count, zygote, read_end, folder)


def _results(
    count: int, zygote: int, read_end: int, folder: Path
) -> Iterator[tuple[int, list[dict[str, Any]]]]:
    finished = 0
    try:
        with os.fdopen(read_end, "rb") as done:
            for line in done:
                i = int(line)
                finished += 1
                yield i, _load(folder / f"{i}.pkl")
    finally:
        if finished < count:  # abandoned (an error, Ctrl-C): stop the zygote and its children
            with contextlib.suppress(ProcessLookupError):
                os.killpg(zygote, signal.SIGTERM)
        os.waitpid(zygote, 0)
        shutil.rmtree(folder, ignore_errors=True)


def _zygote(count: int, job: Job, jobs: int, folder: Path, report: int) -> None:  # pragma: no cover
    """Fork a child per combo, ``jobs`` at a time; tell the parent each index as it is done."""
    running: dict[int, int] = {}
    pending = list(range(count))
    while pending or running:
        while pending and len(running) < jobs:
            i = pending.pop(0)
            pid = os.fork()
            if pid == 0:
                os.close(report)
                os._exit(_child(i, job, folder))
            running[pid] = i
        pid, _ = os.wait()
        if pid in running:
            os.write(report, f"{running.pop(pid)}\n".encode())


def _child(i: int, job: Job, folder: Path) -> int:  # pragma: no cover - a forked child
    try:
        result: Any = job(i)
    except BaseException as exc:  # reported as the combo's failure, never as a pass
        result = exc if isinstance(exc, Exception) else RuntimeError(repr(exc))
    try:
        data = pickle.dumps(result)
    except Exception as exc:  # an exception that does not pickle
        data = pickle.dumps(RuntimeError(f"{type(exc).__name__}: {exc}"))
    tmp = folder / f"{i}.tmp"
    tmp.write_bytes(data)
    tmp.replace(folder / f"{i}.pkl")
    return 0


def _load(path: Path) -> list[dict[str, Any]]:
    try:
        result = pickle.loads(path.read_bytes())
    except OSError:
        raise RuntimeError("the process checking this combo died without a result") from None
    if isinstance(result, BaseException):
        raise result
    return result
