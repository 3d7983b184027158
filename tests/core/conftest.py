from __future__ import annotations

from pathlib import Path

import pytest

from policykit.plugin_manager import make_plugin_manager
from policykit.registry import PolicyRegistry
from policykit.scenario import build_node, load_scenario
from policykit.scheduler import RunResult, Scheduler

SCENARIOS = Path(__file__).resolve().parents[2] / "policykit" / "scenarios"


@pytest.fixture
def registry() -> PolicyRegistry:
    return PolicyRegistry.from_plugins(make_plugin_manager(entry_points=False))


@pytest.fixture
def run_scenario(registry):
    def run(name: str, combo: str) -> RunResult:
        sc = load_scenario(SCENARIOS / f"{name}.json")
        node = build_node(sc)
        return Scheduler(node, registry.resolve(combo, config=sc.config)).run()

    return run
