"""Eviction at admission: a host load-back evicts a prefix a later request of the round would
have hit (SGLang 0.5.23's ``init_load_back`` runs while it admits the request)."""

from __future__ import annotations

from policykit.plan import EntryKind
from policykit.pool import TokenPool
from policykit.prefix_cache import PrefixCache
from policykit.scenario import build_node, parse_scenario
from policykit.scheduler import Scheduler

# 640 free slots; r0 loads 800 host tokens back, so 160 must be evicted at its admission. The
# first sort of a non-empty queue refreshes the waiting prefixes (SGLang's
# ``_touch_waiting_prefixes``, every 32nd sort): round 1 spends it on w alone, so in round 2
# r1's 512-token prefix is the least recently used cached prefix
LOAD_BACK_EVICTS = {
    "page_size": 16,
    "chunked_prefill_size": 4096,
    "pool": {"free_tokens": 656, "evictable_tokens": 3712},
    "requests": [
        {"id": "w", "prompt_tokens": 16},
        {"id": "r0", "prompt_tokens": 2000, "host_prefix_tokens": 800, "arrival_round": 2},
        {"id": "r1", "prompt_tokens": 600, "device_prefix_tokens": 512, "arrival_round": 2},
    ],
}


def test_a_load_back_evicts_the_prefix_a_later_request_would_hit(registry):
    node = build_node(parse_scenario(LOAD_BACK_EVICTS))
    result = Scheduler(node, registry.resolve("admission=sglang,chunking=sglang")).run()
    second = result.rounds[1].plan.entries
    assert [(e.request_id, e.start, e.end, e.cached, e.load_back) for e in second] == [
        ("r0", 800, 2000, 0, 800),
        ("r1", 0, 600, 0, 0),
    ]
    assert all(e.kind is EntryKind.WHOLE for e in second)
    assert result.oom is None and sorted(result.completed) == ["r0", "r1", "w"]


def test_the_refresh_keeps_a_waiting_prefix_over_idle_cache(registry):
    """All three in round 1: the refresh makes r1's prefix newer than the idle filler, which
    r0's load-back evicts instead."""
    both = LOAD_BACK_EVICTS | {
        "requests": [{**r, "arrival_round": 1} for r in LOAD_BACK_EVICTS["requests"]]
    }
    node = build_node(parse_scenario(both))
    result = Scheduler(node, registry.resolve("admission=sglang,chunking=sglang")).run()
    r1 = next(e for e in result.rounds[0].plan.entries if e.request_id == "r1")
    assert (r1.start, r1.cached) == (512, 512)


def test_a_load_back_that_fits_the_free_pool_evicts_nothing(registry):
    roomy = LOAD_BACK_EVICTS | {"pool": {"free_tokens": 16 * 200, "evictable_tokens": 3712}}
    roomy["requests"] = [{**r, "arrival_round": 1} for r in LOAD_BACK_EVICTS["requests"][1:]]
    node = build_node(parse_scenario(roomy))
    result = Scheduler(node, registry.resolve("admission=sglang,chunking=sglang")).run()
    r1 = next(e for e in result.rounds[0].plan.entries if e.request_id == "r1")
    assert (r1.start, r1.cached) == (512, 512)


def _cache() -> tuple[PrefixCache, list[list[int]]]:
    pool = TokenPool(16 * 64, 16)
    cache = PrefixCache(pool)
    prompts = [[7] * 32 + [i] * 32 for i in range(1, 5)]  # a shared 32-token parent
    for prompt in prompts:
        cache.insert(prompt, pool.alloc(len(prompt) // 16, tokens=len(prompt)))
    return cache, prompts


def test_victims_are_what_evict_takes_and_change_nothing():
    cache, _ = _cache()
    before = (cache.evictable_tokens, cache.pool.free_tokens)
    foreseen = [n.id for n in cache.victims(80)]
    assert (cache.evictable_tokens, cache.pool.free_tokens) == before
    taken: list = []
    cache.evict(80, taken)
    assert [n.id for n in taken] == foreseen and len(foreseen) == 3
    cache, _ = _cache()
    everything = cache.victims(1000)
    assert len(everything) == 5 and everything[-1].children  # the parent once its leaves went


def test_victims_skip_kept_nodes_and_continue_after_gone_ones():
    cache, prompts = _cache()
    _, oldest, _ = cache.match(prompts[0])  # now the most recently used
    first = cache.victims(64)
    assert oldest.id not in {n.id for n in first}
    kept = cache.victims(64, keep={first[0].id})
    assert first[0].id not in {n.id for n in kept}
    later = cache.victims(64, gone={n.id for n in first})
    assert not {n.id for n in later} & {n.id for n in first}
    assert cache.match(prompts[0], gone={oldest.id})[0] < cache.match(prompts[0])[0]
