from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from policykit.cli.sweep import sweep_units
from policykit.executor import SweepResults, Unit, open_executor, run_units
from policykit.plugin_manager import make_plugin_manager
from policykit.registry import PolicyRegistry
from policykit.scenario import build_node, load_scenario
from policykit.scheduler import Scheduler

SCENARIOS = Path(__file__).resolve().parents[2] / "policykit" / "scenarios"
BUNDLED = ("seed-abc", "seed-incident-1keim")
#: the incident's upstream combo (OOMs), its fix, and two others: outcomes differ between them
COMBOS = ";".join(
    [
        "admission=sglang,chunking=sglang,alignment=checkpoint:256",
        "admission=reserve-tail,chunking=sglang,alignment=checkpoint:256",
        "admission=no-evict,chunking=defer,alignment=page",
        "admission=sglang,chunking=sglang,alignment=truncation:192",
    ]
)


@pytest.fixture(scope="session")
def registry() -> PolicyRegistry:
    return PolicyRegistry.from_plugins(make_plugin_manager())


@pytest.fixture(scope="session")
def simulate_units(registry) -> list[Unit]:
    """4 combos x the two bundled scenarios, built the way ``policykit sweep`` builds them."""
    scenarios = [load_scenario(SCENARIOS / f"{name}.json") for name in BUNDLED]
    return sweep_units(scenarios, COMBOS.split(";"), registry, max_rounds=10_000)


#: bench units: 2 combos x 2 harness workloads on the tiny model, on the CPU
BENCH_WORKLOADS = ("host-hit-heavy", "seed-incident")
BENCH_COMBOS = (
    "admission=sglang,chunking=sglang,alignment=checkpoint:256",
    "admission=reserve-tail,chunking=sglang,alignment=checkpoint:256",
)
#: the fields of a bench row that do not depend on timing
BENCH_OUTCOME = (
    "combo",
    "status",
    "crash",
    "requests",
    "rounds",
    "prompt_tokens_completed",
    "computed_tokens",
    "flops",
    "handoff_bytes",
    "peak_kv_utilisation",
    "peak_kv_held",
)


@pytest.fixture(scope="session")
def bench_units() -> list[Unit]:
    return [
        Unit(
            f"bench/{w}/{c}",
            "bench",
            "policykit.executor.units:bench_unit",
            {"workload": w, "combo": c, "device": "cpu", "model": "tiny"},
        )
        for w in BENCH_WORKLOADS
        for c in BENCH_COMBOS
    ]


def bench_outcome(row: dict[str, Any]) -> dict[str, Any]:
    return {key: row[key] for key in BENCH_OUTCOME}


@pytest.fixture(scope="session")
def local_sweep(simulate_units, bench_units) -> SweepResults:
    """Simulate and bench units run once on two local workers; the Ray test compares to it."""
    with open_executor("local", workers=2) as executor:
        return run_units([*simulate_units, *bench_units], executor)


def direct(registry: PolicyRegistry, unit: Unit) -> dict[str, Any]:
    """The unit's outcome computed in this process straight from the core, no executor."""
    _, name, combo = unit.id.split("/", 2)
    sc = load_scenario(SCENARIOS / f"{name}.json")
    run = Scheduler(build_node(sc), registry.resolve(combo, config=sc.config)).run()
    committed = [r for r in run.rounds if run.oom is None or r.plan.round != run.oom.round]
    entries = [e for r in committed for e in r.plan.batch]
    return {
        "oom": None if run.oom is None else (run.oom.round, run.oom.request, run.oom.tokens),
        "completed": run.completed,
        "pending": run.pending,
        "rounds": len(run.rounds),
        "computed": sum(e.tokens for e in entries),
        "load_back": sum(e.load_back for e in entries),
    }


def outcome(result: dict[str, Any]) -> dict[str, Any]:
    """The fields of a simulate unit's result that :func:`direct` computes."""
    oom = result["oom"]
    return {
        "oom": None if oom is None else (oom["round"], oom["request"], oom["tokens"]),
        "completed": result["completed"],
        "pending": result["pending"],
        "rounds": result["rounds"],
        "computed": result["tokens"]["computed"],
        "load_back": result["tokens"]["load_back"],
    }


def faulty(unit_id: str, function: str, **args: Any) -> Unit:
    return Unit(unit_id, "test", f"faulty:{function}", args)
