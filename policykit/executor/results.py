"""The merged results document of a sweep: one generic envelope around every unit's result.

The envelope knows nothing about what the units computed: ``policykit sweep`` fills ``result``
with simulate summaries, bench and check fill it with theirs, and the docs read all of them the
same way (which executor, which node, what failed, what is missing). Bump :data:`SCHEMA` when a
field changes meaning.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from policykit.executor.work import Status, UnitResult

SCHEMA = "policykit.sweep/1"


@dataclass
class SweepResults:
    """Every unit's final result, in the order the units were given."""

    executor: dict[str, Any]
    units: list[UnitResult]
    #: when the sweep started, ISO 8601 UTC
    created: str = ""
    wall_seconds: float = 0.0
    #: the sweep was cancelled (Ctrl-C) before every unit got a final result
    interrupted: bool = False
    #: top-level fields a command adds to the envelope (``kind``, ``device``, ``model``...)
    extra: dict[str, Any] = field(default_factory=dict)

    def ids(self, status: Status) -> list[str]:
        return [r.unit.id for r in self.units if r.status is status]

    @property
    def failed(self) -> list[str]:
        return self.ids(Status.FAILED)

    @property
    def missing(self) -> list[str]:
        return self.ids(Status.MISSING)

    @property
    def all_ok(self) -> bool:
        return all(r.status is Status.OK for r in self.units)

    def to_dict(self) -> dict[str, Any]:
        return {
            "schema": SCHEMA,
            "created": self.created,
            "executor": self.executor,
            "wall_seconds": self.wall_seconds,
            "interrupted": self.interrupted,
            **self.extra,
            "units": [r.to_dict() for r in self.units],
            "failed": self.failed,
            "missing": self.missing,
        }

    def write(self, path: Path) -> None:
        """Write the document atomically: a reader never sees half a file."""
        tmp = path.with_name(path.name + ".tmp")
        tmp.write_text(json.dumps(self.to_dict(), indent=2) + "\n", encoding="utf-8")
        tmp.replace(path)
