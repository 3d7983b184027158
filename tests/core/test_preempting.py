"""policykit's node that preempts (vLLM 0.33.0's scheduler as a model), without vLLM installed.

The expectations are the hand-derived ones of tests/upstream/test_vllm_oracle.py, which vLLM's
real scheduler meets: the model must meet them too. 16-token blocks; pool sizes in usable
blocks.
"""

from __future__ import annotations

import random
import sys
from pathlib import Path

import pytest

import policykit
from policykit.errors import ComboError, PolicyError, ScenarioError
from policykit.plugin_manager import make_plugin_manager
from policykit.preempting_scenario import prepare, run
from policykit.registry import PolicyRegistry, format_combo, parse_combo
from policykit.scenario import build_node, parse_scenario
from policykit.scheduler import Scheduler

REPO = Path(__file__).resolve().parents[2]
REGISTRY = PolicyRegistry.from_plugins(make_plugin_manager(entry_points=False))
VLLM = "vllm/vllm/none/default/fcfs/vllm"


def scenario(requests, *, pool=160, chunk=64, release=None, evictable=0):
    return parse_scenario(
        {
            "name": "model-test",
            "page_size": 16,
            "chunked_prefill_size": chunk,
            "pool": {"free_tokens": pool, "evictable_tokens": evictable},
            "kv_release_rounds": release,
            "requests": requests,
        }
    )


def rows(sc, combo=VLLM, registry=REGISTRY):
    sched, _ = prepare(sc, registry.resolve(combo), max_running=len(sc.requests) + 1)
    steps = run(sched, len(sc.requests))
    return [(s.scheduled, s.preempted, s.completed, s.released, s.blocks_used) for s in steps]


def test_chunking_full_sequence_reservation_and_release():
    sc = scenario(
        [
            {"id": "A", "prompt_tokens": 100},
            {"id": "B", "prompt_tokens": 40},
            {"id": "C", "prompt_tokens": 30, "arrival_round": 3},
        ],
        release=2,
    )
    assert rows(sc) == [
        ({"A": 64}, [], [], [], 4),
        ({"A": 36, "B": 28}, [], ["A"], [], 9),
        ({"B": 12}, [], ["B"], ["A"], 10),  # C's whole prompt does not fit: it waits
        ({"C": 30}, [], ["C"], ["B"], 5),
        ({}, [], [], ["C"], 2),
    ]


def test_preemption_takes_the_last_admitted_and_its_cached_blocks_come_back():
    two = [{"id": "A", "prompt_tokens": 120}, {"id": "B", "prompt_tokens": 120}]
    assert rows(scenario(two, release=0), "vllm/vllm-threshold:32/none/default/fcfs/vllm") == [
        ({"A": 32, "B": 32}, [], [], [], 4),
        ({"A": 32, "B": 32}, [], [], [], 8),
        ({"A": 32}, ["B"], [], [], 6),  # B cannot get 2 blocks: running[-1] is B itself
        ({"A": 24}, [], ["A"], ["A"], 8),
        ({"B": 64}, [], [], [], 6),  # alone: no threshold, 2 surviving cached blocks hit
        ({"B": 24}, [], ["B"], ["B"], 8),
    ]


def test_full_sequence_reservation_off_admits_on_the_first_chunk():
    two = [{"id": "A", "prompt_tokens": 120}, {"id": "B", "prompt_tokens": 120}]
    off = rows(scenario(two, chunk=48, release=0), "vllm-no-reserve/vllm/none/default/fcfs/vllm")
    assert [r[0] for r in off][:3] == [{"A": 48}, {"A": 48}, {"A": 24, "B": 24}]
    assert off[2][4] == 10
    on = rows(scenario(two, chunk=48, release=0))
    assert on[2][0] == {"A": 24}


def test_device_prefixes_are_prefix_cache_hits():
    sc = scenario(
        [
            {"id": "A", "prompt_tokens": 100, "device_prefix_tokens": 32},
            {"id": "B", "prompt_tokens": 40, "device_prefix_tokens": 16,
             "device_prefix_pinned": True},
        ],
        evictable=32,
    )  # fmt: skip
    assert rows(sc) == [({"A": 64}, [], [], [], 7), ({"A": 4, "B": 24}, [], ["A", "B"], [], 10)]


def test_a_request_that_never_fits_waits_and_the_run_stops_when_nothing_changes():
    assert rows(scenario([{"id": "A", "prompt_tokens": 200}])) == [({}, [], [], [], 0)]


def test_the_preemption_policy_chooses_the_victim(monkeypatch):
    monkeypatch.syspath_prepend(str(REPO / "examples"))
    import tutorial_kinds

    pm = make_plugin_manager(entry_points=False)
    pm.register(tutorial_kinds, name="tutorial-kinds")
    registry = PolicyRegistry.from_plugins(pm)
    sys.modules.pop("tutorial_kinds", None)
    # 12 blocks; B's first 2 blocks are an evictable cached prefix. Threshold 32, no reservation
    three = [
        {"id": "A", "prompt_tokens": 80},
        {"id": "B", "prompt_tokens": 120, "device_prefix_tokens": 32},
        {"id": "C", "prompt_tokens": 40, "arrival_round": 2},
    ]
    sc = scenario(three, release=0, evictable=32)
    combo = "vllm-no-reserve/vllm-threshold:32/none/default/fcfs/"
    # round 3: A takes 1 of the 2 free blocks for its last 16; B needs 2 for its last 24
    assert [r[:3] for r in rows(sc, combo + "vllm")][2:] == [
        ({"A": 16}, ["B"], ["A"]),  # vLLM preempts running[-1]: B itself, 96 tokens computed
        ({"B": 24, "C": 32}, [], ["B"]),  # B's cached blocks survived: only 24 to recompute
        ({"C": 8}, [], ["C"]),
    ]
    assert [r[:3] for r in rows(sc, combo + "fewest-computed")][2:] == [
        # fewest-computed preempts A (64 computed), although it was already scheduled this
        # step: its 16 tokens go back to the budget, its blocks to the pool, and B fits
        ({"B": 24}, ["A"], ["B"]),
        ({"A": 16, "C": 32}, [], ["A"]),
        ({"C": 8}, [], ["C"]),
    ]
    # the tutorial's most-blocks picks B too (it holds more blocks than A): the requester itself
    assert rows(sc, combo + "most-blocks", registry) == rows(sc, combo + "vllm")


def test_combos_print_one_way_and_old_spellings_still_parse():
    assert str(REGISTRY.resolve(VLLM)) == VLLM
    assert str(REGISTRY.resolve("reserve-tail/sglang/page")) == "reserve-tail/sglang/page"
    assert parse_combo("sglang/defer/page/default/lpm")["preemption"] == "none"
    assert format_combo({"preemption": "vllm"}) == "reserve-tail/sglang/page/default/fcfs/vllm"


@pytest.mark.parametrize(
    ("combo", "words"),
    [
        ("vllm/sglang/page", "never preempts"),
        ("sglang/vllm-threshold:64/page", "never preempts"),
        ("vllm/vllm/none/default/fcfs-skip/vllm", "fcfs or lpm"),
    ],
)
def test_policies_for_the_other_node_are_refused_with_a_reason(combo, words):
    with pytest.raises(ComboError, match=words):
        REGISTRY.resolve(combo)


def test_sglang_policies_decide_on_the_node_that_preempts():
    sc = scenario([{"id": "A", "prompt_tokens": 100}, {"id": "B", "prompt_tokens": 40}])
    out = rows(sc, "no-evict/sglang/page/default/lpm/vllm")
    assert out[0][0] == {"A": 64}  # sglang chunking: a truncated chunk in whole pages
    assert all(not r[1] for r in out)


def test_the_ledger_scheduler_refuses_a_combo_that_preempts():
    sc = scenario([{"id": "A", "prompt_tokens": 10}])
    with pytest.raises(ComboError, match="preempts"):
        Scheduler(build_node(sc), REGISTRY.resolve(VLLM))


def test_fields_a_preempting_node_has_no_meaning_for_are_refused():
    sc = parse_scenario(
        {
            "page_size": 16,
            "chunked_prefill_size": 64,
            "pool": {"free_tokens": 160},
            "requests": [{"id": "A", "prompt_tokens": 100, "host_prefix_tokens": 16}],
        }
    )
    with pytest.raises(ScenarioError, match="host tier"):
        prepare(sc, REGISTRY.resolve(VLLM))


class _Recorder:
    """An observer plugin: the preemptions the node reports through the hook."""

    def __init__(self):
        self.seen = []

    @policykit.hookimpl
    def policykit_preempt(self, round_no, request_id, victim_id):
        self.seen.append((round_no, request_id, victim_id))


class _Broken(policykit.PreemptionPolicy):
    """Ranks with a string: a broken contract."""

    name = "broken"

    def victim_rank(self, v):
        return "last"


class _BrokenPlugin:
    @policykit.hookimpl
    def policykit_register_policies(self, register):
        register(_Broken)


def test_preemptions_reach_the_observer_hook_and_a_broken_rank_names_its_policy():
    recorder = _Recorder()
    pm = make_plugin_manager(entry_points=False)
    pm.register(recorder, name="recorder")

    pm.register(_BrokenPlugin(), name="broken-preemption")
    registry = PolicyRegistry.from_plugins(pm)
    two = scenario(
        [{"id": "A", "prompt_tokens": 120}, {"id": "B", "prompt_tokens": 120}], release=0
    )
    combo = "vllm/vllm-threshold:32/none/default/fcfs/"
    sched, _ = prepare(two, registry.resolve(combo + "vllm"), pm=pm)
    run(sched, 2)
    assert recorder.seen == [(3, "B", "B")]
    sched, _ = prepare(two, registry.resolve(combo + "broken"), pm=pm)
    with pytest.raises(PolicyError, match=r"preemption policy 'broken'.*'last'"):
        run(sched, 2)


def test_every_preempting_combo_runs_and_accounts_for_every_request():
    from policykit.config import EngineConfig
    from policykit.conformance.vllm.compare import random_scenario

    kinds = ("admission", "chunking", "alignment", "queue", "preemption")
    combos = [c for c in REGISTRY.all_combos(EngineConfig(16, 64), kinds=kinds) if c.preempts]
    assert len(combos) > 100 and any(c.chunking.name == "vllm-threshold" for c in combos)
    rng = random.Random(3)
    scenarios = [sc for sc, _ in (random_scenario(rng, i) for i in range(40))]
    scenarios = [sc for sc in scenarios if sc.config.page_size == 16][:6]
    for combo in combos:
        for sc in scenarios:
            sched, _ = prepare(sc, combo)
            steps = run(sched, len(sc.requests), 500)
            node = sched.node
            on_node = node.waiting + node.running + node.finished + node.future
            assert sorted(r.id for r in on_node) == sorted(r.id for r in sc.requests)
            assert all(s.blocks_used + s.blocks_free == node.pool.num_blocks for s in steps)
