"""Both nodes order their waiting queue by one rule (``policykit.kernel.queue_order``).

The node that preempts used to sort under any sorting queue policy, where SGLang's planner
honours the policy's ``sort_limit`` (upstream's ``lpm`` stops sorting a long queue and keeps
its last order): the same combo then meant two orders. Now both nodes keep the queue's own
order once it is longer than the limit, and sort it below.
"""

from __future__ import annotations

import dataclasses

from policykit.plugin_manager import make_plugin_manager
from policykit.policy import QueuePolicy, QueueView
from policykit.preempting_scenario import prepare
from policykit.registry import PolicyRegistry
from policykit.scenario import build_node, parse_scenario
from policykit.scheduler import Scheduler

REGISTRY = PolicyRegistry.from_plugins(make_plugin_manager(entry_points=False))


class ShortestFirst(QueuePolicy):
    """The shortest prompt first, but only while at most two requests wait."""

    name = "shortest-first"
    sort_limit = 2

    def priority(self, v: QueueView) -> int:
        return v.prompt_tokens


def _scenario(prompts: list[int]):
    requests = [{"id": chr(ord("A") + i), "prompt_tokens": p} for i, p in enumerate(prompts)]
    return parse_scenario(
        {
            "name": "queue-order",
            "page_size": 16,
            "chunked_prefill_size": 64,
            "pool": {"free_tokens": 4096, "evictable_tokens": 0},
            "requests": requests,
        }
    )


def _orders(prompts: list[int]) -> tuple[list[str], list[str]]:
    """The first round's queue order on SGLang's planner and on the node that preempts."""
    sc = _scenario(prompts)
    sglang = REGISTRY.resolve("sglang/sglang/none/default/fcfs")
    node = build_node(sc)
    sched = Scheduler(node, dataclasses.replace(sglang, queue=ShortestFirst()))
    node.arrive(1)
    planner = [r.id for r in sched.planner.queue()]
    vllm = REGISTRY.resolve("vllm/vllm/none/default/fcfs/vllm")
    preempting, _ = prepare(sc, dataclasses.replace(vllm, queue=ShortestFirst()))
    preempting.node.arrive(1)
    return planner, [r.id for r in preempting._queue()]


def test_a_short_queue_is_sorted_on_both_nodes() -> None:
    assert _orders([48, 16]) == (["B", "A"], ["B", "A"])


def test_a_queue_over_the_sort_limit_keeps_its_order_on_both_nodes() -> None:
    assert _orders([48, 32, 16]) == (["A", "B", "C"], ["A", "B", "C"])
