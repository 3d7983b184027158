"""What a ``--workload`` argument names, decided once for ``bench`` and ``simulate``.

The argument may be a bundled production trace, a trace file (Mooncake JSONL, Azure CSV), a
policykit-trace file, a scenario (a file or a bundled name) or a generated workload's name.
Deciding that in one place keeps the two commands from disagreeing about a name, and keeps a
file that exists but holds no workload from being reported as "no workload named".
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum
from pathlib import Path

from policykit.harness.trace_formats import is_trace_workload, unreadable_workload
from policykit.harness.workloads import GENERATORS, unknown_workload


class WorkloadKind(Enum):
    """How a workload runs: a timed trace through the roofline clock, or rounds."""

    #: a bundled production trace, or a Mooncake/Azure file (timestamps, a roofline clock)
    TRACE = "trace"
    #: a policykit-trace JSONL file (arrivals in rounds)
    TRACE_FILE = "trace-file"
    #: a scenario file, or a bundled scenario's name
    SCENARIO = "scenario"
    #: a generated workload, by name
    GENERATED = "generated"


@dataclass(frozen=True)
class WorkloadRef:
    """What the argument names; ``path`` for a file (a bundled scenario's too)."""

    kind: WorkloadKind
    arg: str
    path: Path | None = None

    @property
    def file(self) -> Path:
        """The file of a reference that always has one (a trace file, a scenario)."""
        assert self.path is not None, f"the {self.kind.value} {self.arg!r} names no file"
        return self.path


def find_workload(arg: str) -> WorkloadRef:
    """The workload ``arg`` names; a :class:`~policykit.harness.workloads.WorkloadError` saying
    what is wrong with a file that holds none, or what names exist."""
    path = Path(arg)
    if is_trace_workload(arg):
        return WorkloadRef(WorkloadKind.TRACE, arg, path if path.is_file() else None)
    if path.suffix == ".jsonl":
        return WorkloadRef(WorkloadKind.TRACE_FILE, arg, path)
    if path.suffix == ".json" or (not path.suffix and path.exists()):
        return WorkloadRef(WorkloadKind.SCENARIO, arg, path)
    from policykit.scenario import bundled_scenarios

    bundled = bundled_scenarios()
    if arg in bundled:
        return WorkloadRef(WorkloadKind.SCENARIO, arg, bundled[arg])
    if path.is_file():
        raise unreadable_workload(path)
    if arg not in GENERATORS:
        raise unknown_workload(arg)
    return WorkloadRef(WorkloadKind.GENERATED, arg)
