"""Fixtures for the reliability tests: small nodes with requests, built from real parts."""

from __future__ import annotations

from pathlib import Path

import pytest

from policykit.plugin_manager import make_plugin_manager
from policykit.registry import PolicyRegistry
from policykit.scenario import build_node, load_scenario
from policykit.scheduler import Scheduler

from .node_invariants import fingerprint


def pytest_collection_modifyitems(config, items):
    """Soak tests run only when asked for (``pytest -m soak``)."""
    if "soak" in (config.getoption("-m") or ""):
        return
    skip = pytest.mark.skip(reason="long soak: run with -m soak")
    for item in items:
        if "soak" in item.keywords:
            item.add_marker(skip)


SCENARIOS = Path(__file__).resolve().parents[2] / "policykit" / "scenarios"


@pytest.fixture
def run_bundled():
    """Run a bundled scenario round by round; also return the node's fingerprint taken right
    before the last round's commit (what a failed commit must restore)."""

    def run(name: str, combo: str):
        registry = PolicyRegistry.from_plugins(make_plugin_manager(entry_points=False))
        sc = load_scenario(SCENARIOS / f"{name}.json")
        node = build_node(sc)
        sched = Scheduler(node, registry.resolve(combo, config=sc.config))
        commit = node.commit
        before = []

        def remember_then_commit(plan):
            before[:] = [fingerprint(node)]
            commit(plan)

        node.commit = remember_then_commit
        result = sched.run()
        return node, result, before[0]

    return run
