"""Random scenarios under random combos: the bookkeeping never goes wrong."""

from __future__ import annotations

import torch
from hypothesis import given
from hypothesis import strategies as st

from policykit.config import EngineConfig
from policykit.plugin_manager import make_plugin_manager
from policykit.registry import PolicyRegistry
from policykit.request import State
from policykit.scenario import build_node, parse_scenario
from policykit.scheduler import Scheduler

REGISTRY = PolicyRegistry.from_plugins(make_plugin_manager(entry_points=False))
#: every combo that runs on the plain KV pools drawn below (no sliding window)
COMBOS = [str(c) for c in REGISTRY.all_combos(EngineConfig(page_size=16, chunked_prefill_size=256))]


@st.composite
def scenarios(draw):
    page = draw(st.sampled_from([16, 64]))
    n = draw(st.integers(1, 6))
    requests = []
    for i in range(n):
        prompt = draw(st.integers(1, 40 * page))
        device = draw(st.integers(0, prompt // page)) * page
        if device >= prompt:
            device = 0
        host = draw(st.integers(0, max(prompt - device - 1, 0)))
        requests.append(
            {
                "id": f"r{i}",
                "prompt_tokens": prompt,
                "device_prefix_tokens": device,
                "device_prefix_pinned": draw(st.booleans()) if device else False,
                "host_prefix_tokens": host,
                "arrival_round": draw(st.integers(0, 3)),
            }
        )
    unpinned = sum(r["device_prefix_tokens"] for r in requests if not r["device_prefix_pinned"])
    return {
        "page_size": page,
        "chunked_prefill_size": draw(st.integers(1, 16)) * page,
        "pool": {
            "free_tokens": draw(st.integers(1, 80)) * page,
            "evictable_tokens": unpinned + draw(st.integers(0, 8)) * page,
        },
        "kv_release_rounds": draw(st.none() | st.integers(0, 3)),
        "requests": requests,
    }


def check_pool(node) -> None:
    owners = node.owned_pages()
    pages = torch.cat(list(owners.values()))
    assert pages.numel() == node.pool.num_pages, "pages lost or duplicated"
    assert torch.unique(pages).numel() == node.pool.num_pages
    assert node.pool.free_tokens + node.pool.used_tokens == node.pool.total_tokens
    assert node.cache.evictable_tokens >= 0 and node.cache.protected_tokens >= 0


@given(data=scenarios(), combo=st.sampled_from(COMBOS))
def test_random_runs_keep_the_books(data, combo):
    sc = parse_scenario(data)
    node = build_node(sc)
    sched = Scheduler(node, REGISTRY.resolve(combo, config=sc.config))

    def after_round(record):
        check_pool(node)
        for mark in record.plan.marks:
            assert mark.cur_rem_tokens >= mark.rem_total_tokens

    result = sched.run(max_rounds=200, on_round=after_round)
    check_pool(node)
    ids = [r["id"] for r in data["requests"]]
    outcome = result.completed + result.pending + list(result.rejected)
    assert sorted(outcome) == sorted(ids), "a request was lost or counted twice"
    for rid in result.completed:
        assert node.requests[rid].state in (State.HELD, State.DONE)
        assert node.requests[rid].seq_len == node.requests[rid].prompt_tokens
    if result.oom is not None:
        assert result.oom.request in result.pending
