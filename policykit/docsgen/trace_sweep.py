"""The load sweep of a production trace: every combo at several loads, through the executor.

A single load says which combos differ there; a sweep says *where* each combo stops coping.
Each load and group of combos is one executor unit (``policykit.harness.trace_bench:
replay_unit``), so ``policykit docs --executor ray`` spreads the sweep over a cluster. Inside a
unit, a combo that provably decides as another is not replayed again
(:func:`~policykit.harness.trace_groups.replay_grouped`). The load is the trace's arrival rate:
``load = 1 / time_scale`` (load 2 replays the trace's arrivals twice as fast). Each combo keeps
only the few figures the chart needs.
"""

from __future__ import annotations

import datetime as dt
import time
from collections.abc import Sequence
from typing import Any

from policykit.executor import Status, SweepProgress, Unit, open_executor, run_units
from policykit.harness.trace_groups import unit_groups
from policykit.registry import Combo

SCHEMA = "policykit.trace-sweep/1"


def verdict(row: dict[str, Any]) -> str:
    """``oom``, ``starved`` (a request waited past the starvation bound, or can never
    complete) or ``ok``."""
    if row.get("crash") is not None:
        return "oom"
    outcomes = row["outcomes"]
    if outcomes["requests"]["starved"] or row.get("starvation") or row.get("never_completes"):
        return "starved"
    return "ok"


def _point(row: dict[str, Any]) -> dict[str, Any]:
    o, p = row["outcomes"], row["predicted"]
    return {
        "verdict": verdict(row),
        "crash_round": o["crash_round"],
        "completed": o["requests"]["completed"],
        "starved": o["requests"]["starved"],
        "ttft_p99_s": p["ttft_s"]["p99"],
        "ttft_p99_rounds": o["ttft_rounds"]["p99"],
        "prefix_hit_rate": o["prefix_hit_rate"],
    }


def run_sweep(
    trace: str,
    combos: Sequence[Combo],
    loads: Sequence[float],
    base: dict[str, Any],
    *,
    executor: str = "local",
    workers: int | None = None,
    ray_address: str | None = None,
    label: str = "load sweep",
    quiet: bool = False,
) -> tuple[dict[str, Any], list[list[dict[str, Any]]]]:
    """Every combo at every load: the :data:`SCHEMA` document, and per load the full rows of
    the combos that ran (what a trace's table is made of), in the order of ``combos``.
    ``base`` holds the unit arguments shared by all (``requests``, ``model``, ``gpu``,
    ``pool_tokens``...)."""
    created = dt.datetime.now(dt.UTC).isoformat(timespec="seconds")
    t0 = time.perf_counter()
    groups = unit_groups(combos)
    units = [
        Unit(
            f"sweep/{trace}/{load:g}/{group[0]}",
            "trace",
            "policykit.harness.trace_bench:replay_unit",
            {**base, "trace": trace, "combos": group, "time_scale": 1 / load},
        )
        for load in loads
        for group in groups
    ]
    with (
        open_executor(executor, workers=workers, ray_address=ray_address) as pool,
        SweepProgress(len(units), label=label, quiet=quiet) as progress,
    ):
        results = run_units(units, pool, listener=progress)
    names = [str(c) for c in combos]
    by_combo: dict[str, list[dict[str, Any] | None]] = {c: [None] * len(loads) for c in names}
    by_load: list[dict[str, dict[str, Any]]] = [{} for _ in loads]
    failed = []
    replay: dict[str, Any] = {}
    summary: dict[str, Any] = {}
    for i, r in enumerate(results.units):
        point, group = divmod(i, len(groups))
        if r.status is Status.OK and r.result is not None:
            for row in r.result["rows"]:
                by_combo[row["combo"]][point] = _point(row)
                by_load[point][row["combo"]] = row
            replay = r.result.get("replay", replay)
            summary = r.result.get("trace_summary", summary)
        else:
            failed.append({"id": r.unit.id, "error": r.error})
            for combo in groups[group]:
                by_combo[combo][point] = {"verdict": "failed"}
    doc = {
        "schema": SCHEMA,
        "created": created,
        "wall_seconds": time.perf_counter() - t0,
        "trace": summary or {"name": trace},
        "axis": "load",
        "points": list(loads),
        "replay": replay,
        "executor": results.executor,
        "combos": by_combo,
        "failed": failed,
    }
    rows = [[got[c] for c in names if c in got] for got in by_load]
    return doc, rows
