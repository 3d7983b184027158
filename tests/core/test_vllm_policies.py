"""The built-in policies that reproduce vLLM 0.33.0's configuration switches, without vLLM:
``--scheduling-policy priority`` (the ``priority`` queue, the ``vllm-priority`` victim),
``long_prefill_token_threshold_adaptive`` and ``enable_chunked_prefill=False``."""

from __future__ import annotations

import random
from dataclasses import dataclass

import pytest

from policykit import kernel
from policykit.config import EngineConfig
from policykit.errors import ComboError, PolicyError
from policykit.plugin_manager import make_plugin_manager
from policykit.plugins.queue import PriorityQueue
from policykit.plugins.vllm import VllmAdaptiveChunking, VllmNoChunking
from policykit.plugins.vllm_preemption import VllmPriorityPreemption
from policykit.policy import ChunkView, PreemptView, QueueView
from policykit.registry import PolicyRegistry

REGISTRY = PolicyRegistry.from_plugins(make_plugin_manager(entry_points=False))
PRIORITY = "vllm/vllm/none/default/priority/vllm-priority"


@dataclass
class Req:
    """What vLLM's ``Request.__lt__`` and its priority victim read."""

    request_id: str
    priority: int
    arrival_time: float

    def __lt__(self, other: Req) -> bool:  # vLLM 0.33.0's, without the id() tie
        return (self.priority, self.arrival_time, self.request_id) < (
            other.priority,
            other.arrival_time,
            other.request_id,
        )


def _requests(rng: random.Random, n: int) -> list[Req]:
    """Few priorities and arrival times, so that both tie often."""
    ids = rng.sample(range(100), n)
    return [Req(f"r{i}", rng.randint(-1, 2), float(rng.randint(0, 3))) for i in ids]


def _stamps(reqs: list[Req]) -> list[int]:
    times = sorted(r.arrival_time for r in reqs)
    return [times.index(r.arrival_time) for r in reqs]


def test_the_priority_queue_over_arrival_order_is_the_heaps_order():
    """Ranked by priority, ties in the base order a priority engine keeps (arrival time, then
    request id): vLLM's heap-pop order, ``sorted`` by ``Request.__lt__``."""
    policy = PriorityQueue()
    rng = random.Random(1)
    for _ in range(300):
        reqs = _requests(rng, rng.randint(1, 9))
        base = sorted(reqs, key=lambda r: (r.arrival_time, r.request_id))
        views = {
            r.request_id: QueueView(100, 0, 0, 16, priority=r.priority, arrival=s)
            for r, s in zip(reqs, _stamps(reqs), strict=True)
        }
        ranked = sorted(base, key=lambda r: kernel.queue_rank(policy, views[r.request_id], "x"))
        assert ranked == sorted(reqs)


def test_the_priority_victim_is_pythons_max_ties_included():
    combo = REGISTRY.resolve(PRIORITY)
    num = kernel.Ints(combo)
    rng = random.Random(2)
    for _ in range(500):
        running = _requests(rng, rng.randint(1, 8))
        expected = max(running, key=lambda r: (r.priority, r.arrival_time))
        orders = [(r.priority, s) for r, s in zip(running, _stamps(running), strict=True)]
        place = kernel.preempting_victim(
            num,
            [(64, 0, 4)] * len(running),
            rng.randrange(len(running)),
            16,
            [r.request_id for r in running],
            orders,
        )
        assert running[place] is expected


def test_the_priority_victim_refuses_a_node_without_priorities():
    view = PreemptView(0, 64, 0, 4, True, 16)
    with pytest.raises(ValueError, match="no request priorities"):
        VllmPriorityPreemption().victim_rank(view)
    combo = REGISTRY.resolve(PRIORITY)
    with pytest.raises(PolicyError, match="vllm-priority"):
        kernel.preempting_victim(kernel.Ints(combo), [(64, 0, 4)] * 2, 0, 16, ["a", "b"])


def test_the_priority_queue_needs_a_node_that_preempts():
    with pytest.raises(ComboError, match="priority"):
        REGISTRY.resolve("sglang/sglang/page/default/priority")


def _chunk_view(remaining: int, budget: int, eligible: int) -> ChunkView:
    return kernel.preempting_chunk_view(remaining, budget, 10_000, eligible, 16)


def test_the_adaptive_threshold_is_floored_at_a_fair_share_of_the_budget():
    policy = REGISTRY.make("chunking", "vllm-adaptive:100@1024")
    assert policy.spec == "vllm-adaptive:100@1024"
    # vLLM's test_long_prefill_threshold_floored_by_fair_share: 1024 // 2 = 512 > 100
    assert policy.new_chunk(_chunk_view(2000, 1024, 2)) == 512
    assert policy.new_chunk(_chunk_view(2000, 1024, 20)) == 100  # 51 < 100: the threshold
    assert policy.resume_chunk(_chunk_view(2000, 300, 1)) == 300  # alone: the budget only
    assert policy.new_chunk(_chunk_view(90, 1024, 3)) == 90


@pytest.mark.parametrize("arg", ["100", "0@1024", "100@0", "a@b", "100@"])
def test_the_adaptive_parameter_is_two_positive_ints(arg):
    with pytest.raises(ComboError, match="N@B"):
        REGISTRY.make("chunking", f"vllm-adaptive:{arg}")


def test_the_adaptive_budget_must_be_the_engines():
    with pytest.raises(ComboError, match="1024-token step budget"):
        REGISTRY.make("chunking", "vllm-adaptive:100@1024", EngineConfig(16, 2048))
    REGISTRY.make("chunking", "vllm-adaptive:100@2048", EngineConfig(16, 2048))
    assert VllmAdaptiveChunking("7@64").threshold == 7


def test_without_chunked_prefill_a_new_request_enters_whole_or_waits():
    policy = VllmNoChunking()
    assert policy.new_chunk(_chunk_view(64, 64, 3)) == 64
    assert policy.new_chunk(_chunk_view(65, 64, 3)) == 0
    assert policy.resume_chunk(_chunk_view(65, 64, 3)) == 64  # vLLM checks no running request
