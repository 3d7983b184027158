"""Which driver runs a scenario through SGLang 0.5.23.

Plain pools run on SGLang's own storage (:mod:`.storage_driver`); hybrid sliding-window pools
still run on :class:`.driver.UpstreamDriver`, whose storage is policykit's node, until SGLang's
SWA allocator runs here too (docs/conformance.md). Kept apart from both drivers so that neither
imports the other's module back.
"""

from __future__ import annotations

from policykit.conformance.sglang.driver import (
    NotExpressible,
    UpstreamDriver,
    UpstreamRun,
    not_expressible,
)
from policykit.conformance.sglang.storage_driver import drive_storage
from policykit.scenario import Scenario


def drive(
    scenario: Scenario, max_rounds: int = 10_000, schedule_policy: str = "fcfs"
) -> UpstreamRun | NotExpressible:
    """Run ``scenario`` through SGLang 0.5.23's scheduler, or say why it cannot be."""
    why = not_expressible(scenario)
    if why is not None:
        return why
    if scenario.config.sliding_window is None:
        return drive_storage(scenario, max_rounds, schedule_policy)
    return UpstreamDriver(scenario, schedule_policy).run(max_rounds)
