"""Running independent units of work in parallel: locally, or on a Ray cluster.

A sweep (combos x scenarios for ``policykit sweep``; combos x workloads x devices for
``bench``; one SMT check per combo for ``check``) is a list of :class:`Unit`\\ s that share
nothing. This package runs such a list on an :class:`Executor` (a local process pool, or Ray),
retries failures once, and merges every unit's outcome into one :class:`SweepResults`
document, whose envelope (``policykit.sweep/1``) is the same whatever the units computed.

The unit-function contract
--------------------------
A unit names its function as ``"module:function"``; the worker imports it, so the module must
be installed wherever the unit runs (every node of a Ray cluster). The function

* is a plain top-level function taking one argument, the unit's ``args`` dict (JSON-able:
  strings, numbers, lists, dicts), and
* returns a JSON-able ``dict``, which lands unchanged in the unit's ``result``.

Raising means the unit failed: the reason is recorded and the unit retried. An outcome being
studied is *not* a failure: a simulated OOM is a result (``{"oom": {...}}``), and so is a
violated SMT property. Units must be deterministic for equal ``args`` where the docs compare
executors unit by unit; timings belong in the result only as measurements.

Plugging a command in takes a unit function and a few lines, e.g. for bench::

    units = [Unit(f"bench/{w}/{c}", "bench", "policykit.executor.units:bench_unit",
                  {"workload": w, "combo": c, "model": preset}, gpu=on_gpu)
             for w in workloads for c in combos]
    with open_executor(name, workers=workers, ray_address=address) as executor:
        with SweepProgress(len(units), label="bench") as progress:
            results = run_units(units, executor, listener=progress)

:mod:`policykit.executor.units` holds the units policykit ships: ``simulate_unit`` (what
``policykit sweep`` runs) and ``bench_unit`` (one harness combination on the model).
"""

from policykit.executor.base import Executor, ExecutorUnavailable
from policykit.executor.driver import run_units
from policykit.executor.factory import EXECUTORS, open_executor
from policykit.executor.progress import SweepProgress
from policykit.executor.results import SCHEMA, SweepResults
from policykit.executor.work import Status, Unit, UnitResult

__all__ = [
    "EXECUTORS",
    "SCHEMA",
    "Executor",
    "ExecutorUnavailable",
    "Status",
    "SweepProgress",
    "SweepResults",
    "Unit",
    "UnitResult",
    "open_executor",
    "run_units",
]
