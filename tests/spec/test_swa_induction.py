"""The sliding-window induction tracks what the commit allocates, not the ledger's estimate.

SGLang 0.5.23 charges a chunk its window-capped estimate (``policykit.ledger.swa_estimate``).
That is more than ``alloc_extend`` takes for a chunk within the compute budget, so the ledger's
headroom can go below zero where the pool does not run out: an invariant on the headroom alone
was not inductive for ``reserve-tail/swa-reserve``, whose ``swa-no-oom`` was only bounded. And
it is less for a chunk past the compute budget, so the headroom alone proved a policy that runs
the pool out of memory.
"""

from __future__ import annotations

import pytest

from policykit.config import EngineConfig
from policykit.plugin_manager import PluginSource, make_plugin_manager
from policykit.registry import PolicyRegistry
from policykit.spec.checker import CheckOptions, check_combo
from tests.spec import custom_policies

HYBRID = EngineConfig(page_size=64, chunked_prefill_size=4096, sliding_window=512)


@pytest.fixture(scope="module")
def acme() -> PolicyRegistry:
    pm = make_plugin_manager(entry_points=False)
    pm.register_source(custom_policies, PluginSource("acme-policies", "acme-policies", "1.0"))
    return PolicyRegistry.from_plugins(pm)


@pytest.mark.parametrize(
    "combo",
    [
        "reserve-tail/swa-reserve/page",
        "sglang/sglang/none",
        "sglang/sglang/none/default/fcfs-skip",
    ],
)
def test_swa_no_oom_is_proved_unbounded(registry, combo):
    options = CheckOptions(properties=("swa-no-oom",))
    (verdict,) = check_combo(registry.resolve(combo), HYBRID, options)
    assert (verdict.verdict, verdict.bound) == ("proved", "unbounded")


def test_a_chunk_past_the_compute_budget_is_not_proved_by_the_estimate(acme):
    """The ledger charges a chunk past the compute budget less than it takes, and the pool
    runs out. The induction step must run the configured ledger: with the step's ledger built
    without the window (it charged every chunk its whole length), the invariant on the real
    allocations went through for this policy."""
    combo = acme.resolve("admission=sglang,chunking=past-compute-budget,alignment=none")
    options = CheckOptions(rounds=2, properties=("swa-no-oom",))
    (verdict,) = check_combo(combo, HYBRID, options)
    assert verdict.verdict == "violated"
    assert verdict.counterexample.failure.detail == "swa"
