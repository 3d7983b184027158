"""``no-starvation``: upstream queues let a never-fitting head starve the rest; a skip does not."""

from __future__ import annotations

import pytest

from policykit.config import EngineConfig
from policykit.spec.checker import CheckOptions, check_combo

CONFIG = EngineConfig(page_size=64, chunked_prefill_size=4096)
UPSTREAM = "admission=sglang,chunking=sglang,alignment=none"


def _verdict(registry, combo: str):
    chosen = registry.resolve(combo)
    options = CheckOptions(properties=("no-starvation",))
    (verdict,) = check_combo(chosen, CONFIG, options)
    return verdict


@pytest.mark.parametrize("queue", ["fcfs", "lpm"])
def test_upstream_queues_starve_behind_a_never_fitting_head(registry, queue):
    v = _verdict(registry, f"{UPSTREAM},queue={queue}")
    assert (v.verdict, v.bound) == ("violated", "round 1")
    failure = v.counterexample.failure
    assert failure is not None and failure.kind == "starves" and failure.round == 1
    # the replayed scenario is the user's to run: the combo it names is the checked one
    assert v.counterexample.scenario["combo"]["queue"] == queue


@pytest.mark.parametrize("admission", ["sglang", "reserve-tail", "no-evict"])
def test_skipping_the_never_fitting_is_proved_for_any_number_of_rounds(registry, admission):
    v = _verdict(registry, f"admission={admission},chunking=sglang,alignment=page,queue=fcfs-skip")
    assert (v.verdict, v.bound) == ("proved", "unbounded")
