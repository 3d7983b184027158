"""The recompute-aware victims (vLLM RFC #54644): who they preempt, and that the checker takes
them as they are (linear integer arithmetic, no refusal)."""

from __future__ import annotations

import random

import pytest

from policykit import kernel
from policykit.config import EngineConfig
from policykit.plugin_manager import make_plugin_manager
from policykit.plugins.recompute_preemption import (
    PROGRESS_STEPS,
    FewestComputedPreemption,
    LeastProgressPreemption,
    progress_steps,
)
from policykit.registry import PolicyRegistry
from policykit.spec import crossval

REGISTRY = PolicyRegistry.from_plugins(make_plugin_manager(entry_points=False))


def _victim(preemption: str, running: list[tuple[int, int, int]], requester: int) -> int:
    """The place in ``running`` (prompt, computed, held blocks) the node preempts."""
    combo = REGISTRY.resolve(f"vllm/vllm/none/default/fcfs/{preemption}", config=EngineConfig())
    ids = [f"r{i}" for i in range(len(running))]
    return kernel.preempting_victim(kernel.Ints(combo), running, requester, 16, ids)


def test_both_are_registered_built_ins_that_preempt():
    for name, cls in (
        ("fewest-computed", FewestComputedPreemption),
        ("least-progress", LeastProgressPreemption),
    ):
        entry = REGISTRY.entry("preemption", name)
        assert entry.cls is cls and cls.preempts
        assert "54644" in (cls.__doc__ or "")


def test_fewest_computed_spares_the_request_that_would_lose_most():
    # running[-1] (vLLM's victim) has computed 4,000 tokens; the one before it 64
    running = [(8192, 2048, 128), (4096, 64, 4), (8192, 4000, 250)]
    assert _victim("vllm", running, requester=0) == 2
    assert _victim("fewest-computed", running, requester=0) == 1


def test_a_tie_goes_to_the_most_recently_admitted_as_in_vllm():
    running = [(4096, 512, 32), (4096, 512, 32), (4096, 512, 32)]
    for name in ("fewest-computed", "least-progress"):
        assert _victim(name, running, requester=0) == 2


def test_least_progress_ranks_by_share_of_the_prompt_not_by_tokens():
    # 1,000 of 1,024 computed (almost done) against 2,000 of 32,768 (barely started)
    running = [(32768, 2000, 125), (1024, 1000, 63)]
    assert _victim("fewest-computed", running, requester=0) == 1
    assert _victim("least-progress", running, requester=0) == 0


def test_progress_steps_is_the_floor_of_the_share_in_sixteenths():
    rng = random.Random(54644)
    for _ in range(2000):
        prompt = rng.randint(1, 1 << 20)
        computed = rng.randint(0, prompt)
        assert progress_steps(computed, prompt) == computed * PROGRESS_STEPS // prompt
    assert progress_steps(0, 7) == 0 and progress_steps(7, 7) == PROGRESS_STEPS


@pytest.mark.parametrize("name", ["fewest-computed", "least-progress"])
def test_the_checker_lifts_the_victim_exactly(name):
    """Cross-validated on the views the node that preempts asks: the lifted function agrees
    with the Python policy, so ``check`` reasons about the victim itself, not a refusal."""
    combo = REGISTRY.resolve(f"vllm-no-reserve/vllm/page/default/fcfs/{name}")
    crossval.check_policies(combo, EngineConfig(64, 4096))
