"""Which driver runs a scenario through SGLang 0.5.23.

Every scenario, with hybrid SWA or without, runs on SGLang's own scheduler and storage
(:mod:`.storage_driver`). Kept apart from the drivers so that neither imports the other's
module back.
"""

from __future__ import annotations

from policykit.conformance.sglang.driver import UpstreamRun
from policykit.conformance.sglang.storage_driver import drive_storage
from policykit.scenario import Scenario


def drive(
    scenario: Scenario,
    max_rounds: int = 10_000,
    schedule_policy: str = "fcfs",
) -> UpstreamRun:
    """Run ``scenario`` through SGLang 0.5.23's scheduler on its own storage (with hybrid SWA,
    its SWA radix tree and ``SWATokenToKVPoolAllocator``; with host prefixes, its HiCache)."""
    return drive_storage(scenario, max_rounds, schedule_policy)
