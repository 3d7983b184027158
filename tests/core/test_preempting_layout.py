"""The node that preempts starts a scenario as vLLM would have reached it (preempting_layout).

Filler first, then each device prefix computed alone in scenario order and freed (unpinned) or
kept (pinned), then the request in progress: hand-derived free queues, the same whatever the
combo under test. The same history on vLLM's real scheduler is checked in
``tests/upstream/test_vllm_conformance.py``.
"""

from __future__ import annotations

import pytest

from policykit.errors import ScenarioError
from policykit.plugin_manager import make_plugin_manager
from policykit.preempting_layout import FILLER, OWNER, layout
from policykit.preempting_scenario import prepare
from policykit.registry import PolicyRegistry
from policykit.scenario import parse_scenario

REGISTRY = PolicyRegistry.from_plugins(make_plugin_manager(entry_points=False))
VLLM = "vllm/vllm/none/default/fcfs/vllm"


def scenario(requests, *, free, evictable, chunk=64, page=16):
    return parse_scenario(
        {
            "page_size": page,
            "chunked_prefill_size": chunk,
            "pool": {"free_tokens": free, "evictable_tokens": evictable},
            "requests": requests,
        }
    )


PREFIXES = scenario(
    [
        {"id": "A", "prompt_tokens": 40, "device_prefix_tokens": 32},
        {"id": "B", "prompt_tokens": 20, "device_prefix_tokens": 16},
        {"id": "D", "prompt_tokens": 20, "device_prefix_tokens": 16, "device_prefix_pinned": True},
        {"id": "E", "prompt_tokens": 30},
    ],
    free=32,
    evictable=16 * 5,  # A's 2 blocks, B's 1, 2 of filler
)


def _queue(sched):
    """The free queue, head first: what each block caches (None: nothing)."""
    pool = sched.node.pool
    return [pool._key_of.get(block) for block in pool.free_queue()]


def test_the_history_is_filler_then_each_prefix_in_scenario_order():
    plan = layout(PREFIXES)
    assert [(w.id, w.tokens, w.keep) for w in plan.warm] == [
        (FILLER + "0", 32, False),
        (OWNER + "A", 32, False),
        (OWNER + "B", 16, False),
        (OWNER + "D", 16, True),
    ]
    assert plan.in_progress is None


def test_filler_then_older_prefixes_are_evicted_first():
    sched, _ = prepare(PREFIXES, REGISTRY.resolve(VLLM))
    # free blocks first, then the filler, then A's prefix, then B's (each tail block first); D's
    # pinned prefix stays held
    assert _queue(sched) == [None, None, (-1, 1), (-1, 0), (0, 1), (0, 0), (1, 0)]
    assert sched.node.pool.used_blocks == 1 and [r.id for r in sched.node.held] == [OWNER + "D"]
    assert sched.round_no == 0 and not sched.node.finished


@pytest.mark.parametrize(
    "combo",
    [
        "vllm-no-reserve/vllm-threshold:8/none/default/fcfs/vllm",
        "vllm/vllm-threshold:1/none/default/fcfs/vllm",
        "sglang/sglang/none/default/fcfs/vllm",
    ],
)
def test_the_layout_does_not_depend_on_the_combo_under_test(combo):
    # warmed together under a threshold of 8, B's 1-block prefix would finish before A's and
    # be freed first; alone, one after another, the order is the scenario's
    ours, _ = prepare(PREFIXES, REGISTRY.resolve(combo))
    reference, _ = prepare(PREFIXES, REGISTRY.resolve(VLLM))
    assert _queue(ours) == _queue(reference)


def test_a_request_in_progress_is_running_with_its_computed_blocks():
    sc = scenario(
        [
            {"id": "A", "prompt_tokens": 30},
            {
                "id": "B",
                "prompt_tokens": 100,
                "device_prefix_tokens": 32,
                "computed_tokens": 70,
                "chunked": True,
            },
        ],
        free=64,
        evictable=32,
        chunk=16,
    )
    plan = layout(sc)
    assert plan.in_progress is not None and plan.in_progress.chunks(16) == [16, 16, 6]
    sched, steps = prepare(sc, REGISTRY.resolve(VLLM))
    node = sched.node
    (b,) = node.running
    # its prefix hit (2 blocks) and ceil(38 / 16) = 3 of its own, the last partial
    assert (b.id, b.computed, len(b.blocks)) == ("B", 70, 5)
    assert steps == 2 + 3  # the owner of its prefix (32 tokens, 16 a step), then 3 chunks
    assert node.pool.free_blocks == 4 and [r.id for r in node.future] == ["A"]
    assert sched.step().scheduled == {"B": 16}  # resumed first in round 1


def test_a_request_in_progress_that_computed_only_its_prefix_is_refused():
    sc = scenario(
        [
            {
                "id": "B",
                "prompt_tokens": 100,
                "device_prefix_tokens": 32,
                "computed_tokens": 32,
                "chunked": True,
            }
        ],
        free=64,
        evictable=32,
    )
    with pytest.raises(ScenarioError, match="state vLLM never holds"):
        prepare(sc, REGISTRY.resolve(VLLM))
