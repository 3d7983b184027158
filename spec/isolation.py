"""Each combo checked in a fresh process forked from one that never ran z3: same answer,
whatever was checked before it, on however many cores, on whichever executor.

A resource budget makes z3's answers independent of the clock, but not of the process: z3's
search depends on where its terms lie in memory (measured: one obligation, solved again and
again in one process between unrelated allocations, spent 39 252, 39 253, 39 274, 39 426 or
39 427 units, and an unrolled query found a different counterexample after another combo had
been checked in the same process). So no combo is checked where anything else ran. A *zygote*
is started as a new Python process (the same start-up every time, whoever starts it: the CLI, an
executor's worker, a test), builds the plugin registry, and forks one child per combo, at most
``jobs`` at a time; each child checks its combo, writes its rows to a file and exits. Every
child starts from the zygote's memory, which nothing changes between forks.

Policies registered in memory only (a plugin manager handed to the CLI by a test or a notebook)
do not exist in a new process: :func:`check_isolated` then forks the zygote from the caller
instead, which keeps each combo apart from the others but not from the caller's history.
"""

from __future__ import annotations

import contextlib
import os
import pickle
import shutil
import signal
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from policykit.errors import PolicykitError
from policykit.interpreter import python_argv

if TYPE_CHECKING:
    from policykit.config import EngineConfig
    from policykit.registry import PolicyRegistry
    from policykit.spec.checker import CheckOptions

Rows = list[dict[str, Any]]


@dataclass(frozen=True)
class Task:
    """One combo to check: its policies by name, the configuration and the options."""

    combo: dict[str, str]
    config: EngineConfig
    options: CheckOptions


def check_isolated(
    tasks: list[Task], jobs: int, registry: PolicyRegistry | None = None
) -> Iterator[tuple[int, Rows]]:
    """Check every task in a child of a zygote, at most ``jobs`` at once; yield ``(i, rows)``
    as each finishes. ``registry``: policies that exist only in this process (the zygote is
    then forked from here); None: the installed plugins (a new zygote process). The zygote is
    started now, before the caller starts any thread (a progress bar)."""
    folder = Path(tempfile.mkdtemp(prefix="policykit-check-"))
    if registry is None:
        zygote = _spawn(tasks, jobs, folder)
        return _results(tasks, zygote.pid, zygote.stdout, folder, zygote.wait)
    read_end, write_end = os.pipe()
    pid = os.fork()
    if pid == 0:  # pragma: no cover - runs in the forked zygote
        os.close(read_end)
        _zygote_main(tasks, jobs, folder, write_end, registry)
    os.close(write_end)
    reader = os.fdopen(read_end, "rb")
    return _results(tasks, pid, reader, folder, lambda: os.waitpid(pid, 0))


def _spawn(tasks: list[Task], jobs: int, folder: Path) -> subprocess.Popen:
    request = pickle.dumps({"tasks": tasks, "jobs": jobs, "folder": str(folder), "path": sys.path})
    zygote = subprocess.Popen(
        python_argv("-c", "from policykit.spec.isolation import serve; serve()"),
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        # string hashing seeded alike in every zygote: set and dict orders the same everywhere
        env={**os.environ, "PYTHONHASHSEED": "0"},
        start_new_session=True,  # its own process group, to stop it with its children
    )
    assert zygote.stdin is not None
    zygote.stdin.write(request)
    zygote.stdin.close()
    return zygote


def serve() -> None:  # pragma: no cover - the spawned zygote's entry point
    """Read a request from stdin, check its tasks, report each index on stdout as it is done."""
    request = pickle.loads(sys.stdin.buffer.read())
    sys.path[:] = request["path"]
    from policykit.plugin_manager import make_plugin_manager
    from policykit.registry import PolicyRegistry

    registry = PolicyRegistry.from_plugins(make_plugin_manager())
    # the checker's modules once, here, rather than in every child (about a second each)
    import policykit.spec.checkable  # noqa: F401

    sys.stdout.flush()
    _zygote_main(
        request["tasks"], request["jobs"], Path(request["folder"]), sys.stdout.fileno(), registry
    )


def _zygote_main(
    tasks: list[Task], jobs: int, folder: Path, report: int, registry: PolicyRegistry
) -> None:  # pragma: no cover - runs in the zygote
    with contextlib.suppress(OSError):
        os.setpgid(0, 0)  # one process group with its children, to stop them together
    code = 0
    try:
        _fork_each(tasks, max(1, jobs), folder, report, registry)
    except BaseException:  # the parent sees the missing results
        code = 1
    os._exit(code)


def _fork_each(
    tasks: list[Task], jobs: int, folder: Path, report: int, registry: PolicyRegistry
) -> None:  # pragma: no cover - runs in the zygote
    """Fork a child per task, ``jobs`` at a time; tell the parent each index as it is done."""
    running: dict[int, int] = {}
    pending = list(range(len(tasks)))
    while pending or running:
        while pending and len(running) < jobs:
            i = pending.pop(0)
            pid = os.fork()
            if pid == 0:
                os.close(report)
                os._exit(_child(tasks[i], registry, folder / f"{i}.pkl"))
            running[pid] = i
        pid, _ = os.wait()
        if pid in running:
            os.write(report, f"{running.pop(pid)}\n".encode())


def _child(task: Task, registry: PolicyRegistry, path: Path) -> int:  # pragma: no cover
    from policykit.spec.checkable import check_or_refuse

    config = task.config
    try:
        combo = registry.resolve(task.combo, config=config)
        verdicts = check_or_refuse(combo, config, task.options, registry.sources(combo))
        result: Any = [v.to_dict() for v in verdicts]
    except Exception as exc:  # this combo's failure, never a pass; the others go on
        said = str(exc) if isinstance(exc, PolicykitError) else f"{type(exc).__name__}: {exc}"
        result = refused_rows(task, f"The check of this combo failed: {said}")
    data = pickle.dumps(result)
    tmp = path.with_suffix(".tmp")
    tmp.write_bytes(data)
    tmp.replace(path)
    return 0


def _results(
    tasks: list[Task], pid: int, reader: Any, folder: Path, wait: Any
) -> Iterator[tuple[int, Rows]]:
    count = len(tasks)
    finished = 0
    try:
        with reader:
            for line in reader:
                i = int(line)
                finished += 1
                yield i, _load(folder / f"{i}.pkl", tasks[i])
        if finished < count:
            raise RuntimeError(
                f"the checker's zygote process stopped after {finished} of {count} combos"
            )
    finally:
        if finished < count:  # abandoned (an error, Ctrl-C): stop the zygote and its children
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(pid, signal.SIGTERM)
        wait()
        shutil.rmtree(folder, ignore_errors=True)


def _load(path: Path, task: Task) -> Rows:
    """The rows a child wrote; where it died first (a policy that exits the process, a crash in
    a native library), the combo's ``refused`` row saying so."""
    try:
        return pickle.loads(path.read_bytes())
    except OSError:
        return refused_rows(
            task,
            "The process checking this combo died without a result (its policies may exit the "
            "process or crash the interpreter); the other combos were checked.",
        )


def refused_rows(task: Task, reason: str) -> Rows:
    """One ``refused`` row for a combo whose check could not finish: a failing member of a
    list gets its own row, with the reason, instead of aborting the whole list."""
    from policykit.registry import format_combo
    from policykit.spec.checkable import REFUSED
    from policykit.spec.checker import Verdict, config_dict

    scope = config_dict(task.config)
    label = format_combo(task.combo)
    note = " ".join(reason.split())
    return [Verdict(label, "*", REFUSED, "-", 0.0, note=note, config=scope).to_dict()]
