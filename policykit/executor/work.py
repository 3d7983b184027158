"""Units of work and their results, as plain data that crosses process and machine borders.

A :class:`Unit` names a function by ``"module:function"`` instead of carrying it, so that it
pickles to a few strings and a JSON-able dict: the same unit runs in a local worker process or
on another machine of a Ray cluster, provided policykit (and the module) is installed there.

:func:`perform` is what every worker runs: it imports the target, calls it with the unit's
arguments, and turns whatever happens inside the call into an :class:`Attempt`. Failures the
worker itself cannot report (the process dies, the unit hangs) are the executor's to record.
"""

from __future__ import annotations

import importlib
import json
import socket
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any

#: a unit function: takes the unit's args, returns a JSON-able dict
UnitFunction = Callable[[dict[str, Any]], dict[str, Any]]


class Status(StrEnum):
    OK = "ok"
    FAILED = "failed"
    #: never finished: the sweep was interrupted (Ctrl-C) before the unit got a final result
    MISSING = "missing"


@dataclass(frozen=True)
class Unit:
    """One independent piece of a sweep: call ``target(args)`` somewhere.

    ``id`` is unique within a sweep and readable (``simulate/seed-abc/admission=...``);
    ``kind`` groups units of one command (``simulate``, ``bench``, ``check``); ``gpu`` asks the
    executor for a device of its own (one CUDA device per local worker, ``num_gpus=1`` on Ray).
    """

    id: str
    kind: str
    target: str
    args: dict[str, Any] = field(default_factory=dict)
    gpu: bool = False

    def to_dict(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "kind": self.kind,
            "target": self.target,
            "args": self.args,
            "gpu": self.gpu,
        }

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Unit:
        return cls(data["id"], data["kind"], data["target"], dict(data["args"]), data["gpu"])


@dataclass(frozen=True)
class Attempt:
    """One try of one unit, as the executor saw it end."""

    unit_id: str
    ok: bool
    result: dict[str, Any] | None = None
    error: str | None = None
    node: str | None = None
    host: str | None = None
    wall_seconds: float | None = None
    #: CPU time of the worker process during the call: unlike wall time, not inflated by
    #: other processes competing for the same cores
    cpu_seconds: float | None = None

    def to_dict(self) -> dict[str, Any]:
        return dict(self.__dict__)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Attempt:
        return cls(**data)


@dataclass
class UnitResult:
    """The final word on one unit after its retries: what the merged results document holds.

    ``errors`` lists the reason of every failed attempt in order, so a unit that recovered on
    its retry still shows what went wrong the first time; ``error`` is the reason it ended
    failed (``None`` when it ended ok or never ended).
    """

    unit: Unit
    status: Status
    executor: str
    result: dict[str, Any] | None = None
    errors: list[str] = field(default_factory=list)
    attempts: int = 0
    node: str | None = None
    host: str | None = None
    wall_seconds: float | None = None
    cpu_seconds: float | None = None

    @property
    def error(self) -> str | None:
        return self.errors[-1] if self.status is Status.FAILED and self.errors else None

    def to_dict(self) -> dict[str, Any]:
        return {
            "id": self.unit.id,
            "kind": self.unit.kind,
            "target": self.unit.target,
            "gpu": self.unit.gpu,
            "status": self.status.value,
            "result": self.result,
            "error": self.error,
            "errors": list(self.errors),
            "attempts": self.attempts,
            "executor": self.executor,
            "node": self.node,
            "host": self.host,
            "wall_seconds": self.wall_seconds,
            "cpu_seconds": self.cpu_seconds,
        }


def resolve_target(target: str) -> UnitFunction:
    """Import ``"module:function"``; raise ``ValueError`` naming what is wrong."""
    module_name, sep, attr = target.partition(":")
    if not sep or not module_name or not attr:
        raise ValueError(f"unit target {target!r} is not of the form 'module:function'")
    func = getattr(importlib.import_module(module_name), attr, None)
    if not callable(func):
        raise ValueError(f"unit target {target!r}: {module_name} has no function {attr!r}")
    return func


def perform(unit: dict[str, Any], *, node: str | None = None, host: str | None = None) -> dict:
    """Run one unit here and report an :class:`Attempt` as a dict.

    Every exception from the import or the call becomes a failed attempt whose reason is the
    exception and the innermost frame, which is enough to find the line on the worker without
    shipping a traceback object between machines.
    """
    host = host or socket.gethostname()
    node = node or host
    unit_id = unit["id"]
    try:
        func = resolve_target(unit["target"])
        started, cpu_started = time.perf_counter(), time.process_time()
        result = func(dict(unit["args"]))
        wall, cpu = time.perf_counter() - started, time.process_time() - cpu_started
        if not isinstance(result, dict):
            raise TypeError(f"the unit function returned {type(result).__name__}, not a dict")
        json.dumps(result)  # a TypeError here says the result would not survive the merge
    except Exception as exc:
        return Attempt(unit_id, False, error=_reason(exc), node=node, host=host).to_dict()
    return Attempt(
        unit_id, True, result, node=node, host=host, wall_seconds=wall, cpu_seconds=cpu
    ).to_dict()


def _reason(exc: BaseException) -> str:
    frames = traceback.extract_tb(exc.__traceback__)
    where = f" (at {frames[-1].filename}:{frames[-1].lineno})" if frames else ""
    return f"{type(exc).__name__}: {exc}{where}"
