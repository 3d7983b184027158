"""Measure the z3 resource units the checker's queries spend, to set the default budgets.

Not a test: a script (``python tests/spec/calibrate_budgets.py [--sliding-window 4096] [--page-size
64] [--rlimit N]``). It checks every built-in combo in this process with a per-query budget of
``--rlimit`` (default: 8x the shipped one), records what each query spent and how it ended, and
prints the distribution per kind of query: the induction's obligations, the bounded search's
unrolled rounds, the single-request fallback and the shrinker's pinned read-back. The method
and the figures are in docs/spec.md ("Solver budgets").
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections import defaultdict

import z3

from policykit.cli.common import load_registry
from policykit.config import EngineConfig
from policykit.spec import checker, induction, shrink, solver
from policykit.spec.checkable import check_or_refuse
from policykit.spec.checker import CheckOptions

SPENT: dict[str, list[tuple[int, str, float]]] = defaultdict(list)


def _recording(kind: str, real):
    def solve(*args, **kwargs):
        t0 = time.process_time()
        outcome = real(*args, **kwargs)
        SPENT[kind].append((outcome.spent, str(outcome.result), time.process_time() - t0))
        return outcome

    return solve


def _percentile(values: list[int], p: float) -> int:
    values = sorted(values)
    return values[min(len(values) - 1, int(p * len(values)))] if values else 0


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--page-size", type=int, default=64)
    ap.add_argument("--sliding-window", type=int, default=None)
    ap.add_argument("--rlimit", type=int, default=8 * solver.QUERY_RLIMIT)
    ap.add_argument("--json", action="store_true")
    a = ap.parse_args()
    for kind, module in (("obligation", induction), ("unrolled", checker), ("pin", shrink)):
        module.solve = _recording(kind, module.solve)  # type: ignore[attr-defined]
    _, registry = load_registry()
    config = EngineConfig(a.page_size, sliding_window=a.sliding_window)
    options = CheckOptions(rlimit=a.rlimit)
    t0 = time.perf_counter()
    verdicts = []
    for combo in registry.all_combos(config):
        verdicts += check_or_refuse(combo, config, options, registry.sources(combo))
    wall = time.perf_counter() - t0
    report = {
        "z3": z3.get_version_string(),
        "page_size": a.page_size,
        "sliding_window": a.sliding_window,
        "rlimit": a.rlimit,
        "wall_s": round(wall, 1),
        "verdicts": {v: sum(x.verdict == v for x in verdicts) for v in checker_verdicts()},
        "kinds": {},
    }
    for kind, rows in SPENT.items():
        answered = [s for s, r, _ in rows if r != "unknown"]
        cpu = sum(c for _, _, c in rows)
        spent = sum(s for s, _, _ in rows)
        report["kinds"][kind] = {
            "queries": len(rows),
            "unknown": len(rows) - len(answered),
            "answered_p50": _percentile(answered, 0.5),
            "answered_p90": _percentile(answered, 0.9),
            "answered_p99": _percentile(answered, 0.99),
            "answered_max": max(answered, default=0),
            "cpu_s": round(cpu, 1),
            "units_per_cpu_s": int(spent / cpu) if cpu else None,
        }
    json.dump(report, sys.stdout, indent=2)
    print()


def checker_verdicts() -> tuple[str, ...]:
    return (checker.PROVED, checker.VIOLATED, checker.UNKNOWN, "refused")


if __name__ == "__main__":
    main()
