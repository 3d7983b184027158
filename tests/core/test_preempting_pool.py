"""The node that preempts keeps its blocks in a real tensor pool, in vLLM's free-queue order.

The order is what decides which cached blocks a preempted request finds again, so it is pinned
here by hand-derived queues; the blocks are the pages of a :class:`~policykit.pool.TokenPool`,
so every block a run takes must be back on that pool's free list when everything is released.
"""

from __future__ import annotations

import random

import pytest
import torch

from policykit.block_pool import BlockPool
from policykit.conformance.vllm.compare import random_scenario
from policykit.plugin_manager import make_plugin_manager
from policykit.pool import KVLayout
from policykit.preempting_scenario import prepare, run
from policykit.registry import PolicyRegistry
from policykit.scenario import parse_scenario

REGISTRY = PolicyRegistry.from_plugins(make_plugin_manager(entry_points=False))
VLLM = "vllm/vllm/none/default/fcfs/vllm"


def test_the_free_queue_keeps_vllms_order_on_the_tensor_pool():
    pool = BlockPool(6, 16)
    assert pool.free_queue() == [1, 2, 3, 4, 5, 6]  # the null block 0 is never handed out
    held = pool.allocate(3)
    assert held == [1, 2, 3] and pool.free_queue() == [4, 5, 6]
    pool.cache(1, "a")
    pool.cache(2, "b")
    pool.free(reversed(held))  # last first: 3 is not cached (front), 2 then 1 to the back
    assert pool.free_queue() == [3, 4, 5, 6, 2, 1]
    assert pool.hit(["a", "b", "c"]) == [1, 2]
    pool.touch([2])  # a hit takes a cached block out of the middle of the queue
    assert pool.free_queue() == [3, 4, 5, 6, 1] and pool.evictable([1, 2]) == 1
    assert pool.allocate(5) == [3, 4, 5, 6, 1]  # evicts "a": block 1 was reused
    assert pool.hit(["a"]) == [] and pool.hit(["b"]) == [2]
    assert pool.free_blocks == 0 and pool.used_blocks == 6


def test_blocks_are_pages_of_a_kv_tensor_pool_on_the_chosen_device():
    layout = KVLayout(layers=2, kv_heads=1, head_dim=4, dtype=torch.float32)
    pool = BlockPool(4, 16, device="cpu", layout=layout)
    assert pool.kv.device == torch.device("cpu") and len(pool.kv.k) == 2
    assert pool.kv.k[0].shape == (5 * 16, 1, 4)  # the null block's page is there too
    blocks = pool.allocate(2)
    slots = pool.slots(blocks, 0, 20)
    assert slots[:16].tolist() == list(range(16 * blocks[0], 16 * blocks[0] + 16))
    assert slots[16:].tolist() == list(range(16 * blocks[1], 16 * blocks[1] + 4))
    with pytest.raises(RuntimeError, match="freed more often"):
        pool.free([3])


def _assert_all_free(sched):
    pool = sched.node.pool
    assert pool.free_blocks == pool.num_blocks and pool.used_blocks == 0
    assert sorted(pool.free_queue()) == list(range(1, pool.num_blocks + 1))
    assert pool.kv.free_pages == pool.num_blocks  # only the null block is off the free list
    assert not any(r.blocks for r in sched.node.finished)


def test_a_run_that_releases_everything_leaves_every_block_free():
    sc = parse_scenario(
        {
            "name": "preempt-and-release",
            "page_size": 16,
            "chunked_prefill_size": 64,
            "pool": {"free_tokens": 128, "evictable_tokens": 32},
            "kv_release_rounds": 1,
            "requests": [
                {"id": "A", "prompt_tokens": 120},
                {"id": "B", "prompt_tokens": 120, "device_prefix_tokens": 32},
                {"id": "C", "prompt_tokens": 40, "arrival_round": 2},
            ],
        }
    )
    sched, _ = prepare(sc, REGISTRY.resolve("vllm/vllm-threshold:32/none/default/fcfs/vllm"))
    steps = run(sched, 3)
    assert sum(len(s.preempted) for s in steps) >= 1, "the scenario is meant to preempt"
    assert sorted(r.id for r in sched.node.finished) == ["A", "B", "C"]
    _assert_all_free(sched)


def test_random_scenarios_leak_no_block():
    rng = random.Random(11)
    checked = 0
    for index in range(60):
        sc, _ = random_scenario(rng, index)
        if sc.config.kv_release_rounds is None or any(r.device_prefix_pinned for r in sc.requests):
            continue
        sched, _ = prepare(sc, REGISTRY.resolve(VLLM))
        run(sched, len(sc.requests), 2_000)
        if len(sched.node.finished) == len(sc.requests):
            _assert_all_free(sched)
            checked += 1
    assert checked >= 10


def test_a_victims_blocks_go_back_to_the_tensor_pool_at_once():
    two = parse_scenario(
        {
            "name": "victim",
            "page_size": 16,
            "chunked_prefill_size": 64,
            "pool": {"free_tokens": 160},
            "kv_release_rounds": 0,
            "requests": [{"id": "A", "prompt_tokens": 120}, {"id": "B", "prompt_tokens": 120}],
        }
    )
    sched, _ = prepare(two, REGISTRY.resolve("vllm/vllm-threshold:32/none/default/fcfs/vllm"))
    node = sched.node
    sched.step()
    sched.step()
    held = {r.id: list(r.blocks) for r in node.running}
    step = sched.step()  # B cannot get its blocks and is its own victim
    assert step.preempted == ["B"] and node.waiting[0].id == "B" and not node.waiting[0].blocks
    queue = node.pool.free_queue()
    # B's 4 full blocks were cached: they went to the back of the queue, last block first
    assert queue[-4:] == held["B"][::-1]
    assert set(queue) == set(range(1, 11)) - set(node.running[0].blocks)
