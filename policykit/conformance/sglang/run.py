"""Which driver runs a scenario through SGLang 0.5.23.

Plain pools run on SGLang's own storage (:mod:`.storage_driver`). Hybrid sliding-window pools
run on :class:`.driver.UpstreamDriver`, whose storage is policykit's node, unless SGLang's own
SWA storage is asked for: policykit does not model that storage yet (docs/conformance.md).
Kept apart from both drivers so that neither imports the other's module back.
"""

from __future__ import annotations

from policykit.conformance.sglang.driver import UpstreamDriver, UpstreamRun
from policykit.conformance.sglang.storage_driver import drive_storage
from policykit.scenario import Scenario


def drive(
    scenario: Scenario,
    max_rounds: int = 10_000,
    schedule_policy: str = "fcfs",
    *,
    swa_storage: bool = False,
) -> UpstreamRun:
    """Run ``scenario`` through SGLang 0.5.23's scheduler. With
    hybrid SWA, SGLang's own SWA storage runs only when ``swa_storage`` is asked for: policykit
    does not model it yet (docs/conformance.md gives the measured differences)."""
    if scenario.config.sliding_window is None or swa_storage:
        return drive_storage(scenario, max_rounds, schedule_policy)
    return UpstreamDriver(scenario, schedule_policy).run(max_rounds)
