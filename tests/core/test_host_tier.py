"""The host tier as SGLang 0.5.23's HiCache holds it: a host run comes with its device prefix
(HiCache backs a node's ancestors up before the node), and a load-back comes back as the
host's nodes."""

from __future__ import annotations

from policykit.host_tier import HostTier
from policykit.plan import EntryKind
from policykit.scenario import build_node, parse_scenario
from policykit.scheduler import Scheduler

TOKENS = tuple(range(100, 1300))


def test_a_run_held_from_token_0_continues_its_device_prefix_and_token_0():
    host = HostTier()
    entry = host.put(TOKENS[:768], 256, held_from=0)
    assert (entry.start, entry.held_from, entry.end) == (256, 0, 768)
    assert host.lookup(TOKENS, 256) is entry
    assert host.lookup(TOKENS, 0) is entry  # the prefix evicted: the host still has it
    assert host.loadable(TOKENS, 256, 16) == 512
    assert host.loadable(TOKENS, 0, 16) == 768
    assert host.lookup(TOKENS, 768) is None  # nothing after the run
    assert host.lookup((1, *TOKENS[1:]), 0) is None  # another prompt


def test_a_run_held_from_its_start_is_found_there_only():
    host = HostTier()
    host.put(TOKENS[:768], 256)
    assert host.loadable(TOKENS, 256, 16) == 512
    assert host.lookup(TOKENS, 0) is None


# w's 1020 tokens evict r0's unpinned 256-token prefix (the only evictable cache); r0 then
# loads its prefix and its 512-token host run back from token 0, as two nodes: r1's demand
# after r0's release takes r0's own KV and the host run's node, and stops at r0's prefix
HOST_PREFIX_EVICTED = {
    "page_size": 16,
    "chunked_prefill_size": 4096,
    "kv_release_rounds": 0,
    "pool": {"free_tokens": 1024, "evictable_tokens": 256},
    "requests": [
        {"id": "w", "prompt_tokens": 1020},
        {
            "id": "r0",
            "prompt_tokens": 1200,
            "device_prefix_tokens": 256,
            "host_prefix_tokens": 512,
            "arrival_round": 2,
        },
        {"id": "r1", "prompt_tokens": 900, "arrival_round": 4},
    ],
}


def test_an_evicted_prefix_loads_back_from_the_host_and_comes_back_as_two_nodes(registry):
    node = build_node(parse_scenario(HOST_PREFIX_EVICTED))
    result = Scheduler(node, registry.resolve("admission=sglang,chunking=sglang")).run()
    r0 = [e for r in result.rounds for e in r.plan.entries if e.request_id == "r0"]
    assert [(e.cached, e.load_back, e.start, e.kind) for e in r0] == [
        (0, 768, 768, EntryKind.WHOLE)
    ]
    cached = node.cache.match(node.requests["r0"].tokens)[0]
    assert cached == 256
