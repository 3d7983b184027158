"""How SGLang 0.5.23's storage evicts, reproduced by the node (pinned against SGLang's own
radix tree and allocation path in ``tests/upstream/test_sglang_conformance.py``)."""

from __future__ import annotations

from policykit.pages import eviction_demand
from policykit.scenario import build_node, parse_scenario
from policykit.scheduler import Scheduler

#: r0's 40 tokens take 3 pages, exactly what is free; SGLang evicts for 40 + one page per
#: request = 56 all the same, so the 64-token filler goes
CONSERVATIVE = {
    "page_size": 16,
    "chunked_prefill_size": 4096,
    "pool": {"free_tokens": 48, "evictable_tokens": 64},
    "requests": [{"id": "r0", "prompt_tokens": 40}],
}

#: r0 runs in two 64-token chunks, so SGLang's tree holds its KV as two nodes; r1's 20 tokens
#: (demand 36, 32 free) evict the later chunk only
CHUNKS = {
    "page_size": 16,
    "chunked_prefill_size": 64,
    "pool": {"free_tokens": 160, "evictable_tokens": 0},
    "kv_release_rounds": 0,
    "requests": [
        {"id": "r0", "prompt_tokens": 128},
        {"id": "r1", "prompt_tokens": 20, "arrival_round": 3},
    ],
}


def _run(scenario: dict, registry):
    node = build_node(parse_scenario(scenario))
    return Scheduler(node, registry.resolve("admission=sglang,chunking=sglang")).run()


def test_the_eviction_demand_is_extend_plus_a_page_per_request():
    assert eviction_demand(100, 3, 16) == 148
    assert eviction_demand(100, 3, 1) == 100  # alloc_token_slots: the extend tokens alone


def test_a_batch_that_fits_the_free_pages_still_evicts_for_its_demand(registry):
    first = _run(CONSERVATIVE, registry).rounds[0]
    assert (first.free_tokens_after, first.evictable_tokens_after) == (64, 0)


def test_a_chunked_request_is_cached_chunk_by_chunk(registry):
    result = _run(CHUNKS, registry)
    third = result.rounds[2]
    assert [e.request_id for e in third.plan.batch] == ["r1"]
    assert (third.free_tokens_after, third.evictable_tokens_after) == (64, 64)
