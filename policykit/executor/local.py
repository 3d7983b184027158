"""The local executor: a pool of spawned worker processes on this machine.

Why not :class:`concurrent.futures.ProcessPoolExecutor`: when one of its workers dies, the whole
pool breaks and every unit in flight fails with the same ``BrokenProcessPool``, so the unit
that killed its worker cannot be told from its innocent neighbours, and a hung unit cannot be
stopped without stopping the pool. Here each worker is a process with its own pipe: a dead
worker fails exactly the unit it was running, a unit past its timeout is ended by killing its
worker, and a fresh worker takes the slot.

Workers are started with the ``spawn`` method (no forked copy of the parent's torch or CUDA
state) and ignore SIGINT: Ctrl-C in a terminal reaches the whole process group, and it is the
driver that decides to cancel, keep the finished units and stop the workers.
"""

from __future__ import annotations

import contextlib
import multiprocessing
import os
import signal
import socket
import time
from dataclasses import dataclass
from multiprocessing.connection import Connection, wait
from multiprocessing.process import BaseProcess
from typing import Any

from policykit.executor.base import Executor
from policykit.executor.work import Attempt, Unit, perform

_CONTEXT = multiprocessing.get_context("spawn")
#: what a worker sends when it picks a unit up, before the attempt itself
_STARTED = "started"


def usable_cpus() -> int:
    """CPUs this process may run on (its affinity mask, where the OS has one)."""
    if hasattr(os, "sched_getaffinity"):
        return len(os.sched_getaffinity(0))
    return os.cpu_count() or 1


def visible_gpus() -> list[str]:
    """CUDA devices this process may hand out, as ``CUDA_VISIBLE_DEVICES`` entries."""
    listed = os.environ.get("CUDA_VISIBLE_DEVICES")
    if listed is not None:
        return [d.strip() for d in listed.split(",") if d.strip()]
    import torch

    return [str(i) for i in range(torch.cuda.device_count())]


def _worker_main(conn: Connection, gpu: str | None, threads: int) -> None:
    """Loop of one worker: receive a unit, perform it, send the attempt back."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    if gpu is not None:  # before anything initialises CUDA
        os.environ["CUDA_VISIBLE_DEVICES"] = gpu
    # before torch is imported: N workers x all-CPU thread pools would oversubscribe the CPUs
    # (Ray sets the same variable for a one-CPU task); a value the user set is kept
    os.environ.setdefault("OMP_NUM_THREADS", str(threads))
    host = socket.gethostname()
    while True:
        try:
            unit = conn.recv()
        except EOFError:
            return
        if unit is None:
            return
        conn.send(_STARTED)  # the timeout runs from here, not from the worker's spawn
        conn.send(perform(unit, node=host, host=host))


@dataclass
class _Worker:
    slot: int
    process: BaseProcess
    conn: Connection
    unit: Unit | None = None
    #: when the worker picked its unit up (None: sent, but the worker is still starting)
    started: float | None = None


class LocalExecutor(Executor):
    """Up to ``workers`` units at a time (default: one per usable CPU), each in its own process.

    With more than one visible GPU, worker slot ``i`` sees only GPU ``i mod n`` (through
    ``CUDA_VISIBLE_DEVICES``), so a GPU unit has a device to itself when ``workers <= n``.
    """

    name = "local"

    def __init__(self, workers: int | None = None, *, timeout: float | None = None) -> None:
        super().__init__(timeout=timeout)
        workers = workers or usable_cpus()
        if workers < 1:
            raise ValueError("a local executor needs at least one worker")
        self.workers = workers
        self.host = socket.gethostname()
        gpus = visible_gpus()
        self._gpus = gpus if len(gpus) > 1 else []
        self._pool: dict[int, _Worker] = {}
        self._threads = max(1, usable_cpus() // workers)

    def describe(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "workers": self.workers,
            "host": self.host,
            "gpus_per_worker": bool(self._gpus),
        }

    # -- slots ------------------------------------------------------------------------------
    def _idle_slot(self) -> int | None:
        for slot in range(self.workers):
            worker = self._pool.get(slot)
            if worker is None or worker.unit is None:
                return slot
        return None

    def has_room(self, unit: Unit) -> bool:
        return self._idle_slot() is not None

    def busy(self) -> bool:
        return any(w.unit is not None for w in self._pool.values())

    def _spawn(self, slot: int) -> _Worker:
        gpu = self._gpus[slot % len(self._gpus)] if self._gpus else None
        parent, child = _CONTEXT.Pipe()
        process = _CONTEXT.Process(
            target=_worker_main,
            args=(child, gpu, self._threads),
            name=f"policykit-worker-{slot}",
            daemon=True,
        )
        process.start()
        child.close()
        worker = self._pool[slot] = _Worker(slot, process, parent)
        return worker

    def submit(self, unit: Unit) -> None:
        slot = self._idle_slot()
        if slot is None:
            raise RuntimeError("submit() without room; ask has_room() first")
        worker = self._pool.get(slot) or self._spawn(slot)
        worker.unit, worker.started = unit, None
        worker.conn.send(unit.to_dict())

    # -- collecting -------------------------------------------------------------------------
    def collect(self, wait_seconds: float) -> list[Attempt]:
        running = [w for w in self._pool.values() if w.unit is not None]
        if not running:
            return []
        wait_for = wait_seconds
        started = [w.started for w in running if w.started is not None]
        if self.timeout is not None and started:
            first_deadline = min(started) + self.timeout
            wait_for = max(0.0, min(wait_seconds, first_deadline - time.monotonic()))
        handles: list[Any] = [w.conn for w in running] + [w.process.sentinel for w in running]
        wait(handles, timeout=wait_for)
        ended: list[Attempt] = []
        for worker in running:
            attempt = self._check(worker)
            if attempt is not None:
                ended.append(attempt)
        return ended

    def _check(self, worker: _Worker) -> Attempt | None:
        unit = worker.unit
        assert unit is not None
        try:
            while worker.conn.poll():
                message = worker.conn.recv()
                if message == _STARTED:
                    worker.started = time.monotonic()
                    continue
                worker.unit = None
                return Attempt.from_dict(message)
        except (EOFError, OSError):
            pass  # the worker died mid-send or after closing: judged below
        if not worker.process.is_alive():
            worker.process.join()
            return self._retire(worker, _death_reason(worker.process.exitcode))
        if (
            self.timeout is not None
            and worker.started is not None
            and time.monotonic() - worker.started > self.timeout
        ):
            self._kill(worker)
            return self._retire(worker, f"timed out after {self.timeout:g} s (worker killed)")
        return None

    def _retire(self, worker: _Worker, reason: str) -> Attempt:
        """Fail the worker's unit and free its slot; a fresh worker is spawned on demand."""
        assert worker.unit is not None
        del self._pool[worker.slot]
        worker.conn.close()
        return Attempt(worker.unit.id, False, error=reason, node=self.host, host=self.host)

    @staticmethod
    def _kill(worker: _Worker) -> None:
        worker.process.kill()
        worker.process.join()

    # -- stopping ---------------------------------------------------------------------------
    def cancel(self) -> None:
        for worker in list(self._pool.values()):
            if worker.unit is not None:
                self._kill(worker)
                worker.conn.close()
                del self._pool[worker.slot]

    def close(self) -> None:
        for worker in self._pool.values():
            with contextlib.suppress(OSError):  # a worker that already died
                worker.conn.send(None)
        for worker in self._pool.values():
            worker.process.join(timeout=5)
            if worker.process.is_alive():
                self._kill(worker)
            worker.conn.close()
        self._pool.clear()


def _death_reason(exitcode: int | None) -> str:
    if exitcode is not None and exitcode < 0:
        try:
            name = signal.Signals(-exitcode).name
        except ValueError:
            name = f"signal {-exitcode}"
        return f"worker process died (killed by {name})"
    return f"worker process died (exit code {exitcode})"
