"""policykit's upstream-faithful combo against SGLang 0.5.23's real ``PrefillAdder``.

Skipped when SGLang is not installed (``pip install '.[sglang]' && pip install --no-deps
sglang==0.5.23``). Each case runs the scenario through both and requires identical batches,
admission verdicts, ledgers and out-of-memory outcomes, round by round.
"""

from __future__ import annotations

import importlib.util
import json
import random
from array import array
from pathlib import Path

import pytest

from policykit.config import EngineConfig
from policykit.host_tier import LOAD_BACK_THRESHOLD
from policykit.registry import builtin_registry
from policykit.scenario import RequestSpec, Scenario, build_node, load_scenario
from policykit.scheduler import Scheduler

if importlib.util.find_spec("sglang") is None:
    pytest.skip("the policykit[sglang] extra is not installed", allow_module_level=True)

from policykit.conformance.sglang.compare import conform, random_scenario
from policykit.conformance.sglang.storage import host_runs

ROOT = Path(__file__).resolve().parents[2]
BUNDLED = sorted((ROOT / "policykit" / "scenarios").glob("*.json"))
#: random scenarios required identical (plain KV pool, host and device prefixes, releases)
RANDOM_COUNT = 300
#: random hybrid-SWA scenarios required identical (SWAPrefillBudget, host prefixes included)
RANDOM_SWA_COUNT = 100
RANDOM_SEED = 20261130


pytestmark = pytest.mark.usefixtures("upstream")


def assert_identical(scenario: Scenario) -> None:
    """Identical decisions and the same storage after every round (upstream runs on its own
    storage, with hybrid SWA too)."""
    verdict = conform(scenario, storage=True)
    assert verdict.differences == [], (
        json.dumps(scenario.to_dict()) + "\n" + "\n".join(verdict.differences)
    )


@pytest.mark.parametrize("path", BUNDLED, ids=lambda p: p.stem)
def test_bundled_scenarios(path):
    assert_identical(load_scenario(path))


def scenario(page, chunk, free, requests, **kw) -> Scenario:
    specs = tuple(
        RequestSpec(f"r{i}", *r) if isinstance(r, tuple) else r for i, r in enumerate(requests)
    )
    config = {k: kw.pop(k) for k in EngineConfig.__dataclass_fields__ if k in kw}
    return Scenario(
        config=EngineConfig(page, chunk, **config),
        free_tokens=free,
        evictable_tokens=kw.pop("evictable", 0),
        requests=specs,
        **kw,
    )


def _budget_edge(page: int, delta: int) -> Scenario:
    # admission needs prompt + first token + page < rem_total; sit right on the boundary
    prompt = 10 * page + 3
    free = (prompt + 1 + page) // page * page + delta * page
    return scenario(page, 8192, max(page, free), [(prompt,), (page + 1,)])


EDGES = {
    **{f"budget{d:+d}-page{p}": _budget_edge(p, d) for p in (1, 16, 64) for d in (-1, 0, 1)},
    "empty-pool": scenario(16, 2048, 16, [(100,), (5,)]),
    # max_prefill_tokens binding, as the example: upstream admits the second
    "max-prefill-binding": scenario(
        64, 8192, 64 * 400, [(3000,), (2000,), (5000,)], max_prefill_tokens=4096
    ),
    "max-prefill-spent": scenario(16, 8192, 16 * 2000, [(3000,), (2000,)], max_prefill_tokens=3000),
    # a head that can never fit blocks everything behind it (upstream fcfs)
    "never-fitting-head": scenario(
        16, 2048, 16 * 100, [(1580,), (100,), (50,)], kv_release_rounds=1
    ),
    "resume-unaligned": scenario(64, 1000, 64 * 200, [(5000,), (700,)]),
    "in-progress-forced": scenario(
        16, 512, 64, [RequestSpec("r0", 4000, computed_tokens=1000, chunked=True), (300,)]
    ),
    "short-host-hit": scenario(
        16, 2048, 16 * 400, [RequestSpec("r0", 900, host_prefix_tokens=9), (100,)]
    ),
    "unaligned-host-hit": scenario(
        64, 2048, 64 * 100, [RequestSpec("r0", 3000, host_prefix_tokens=100), (200,)]
    ),
}


@pytest.mark.parametrize("name", sorted(EDGES))
def test_edge_cases(name):
    assert_identical(EDGES[name])


def _loads_under_the_threshold(sc: Scenario) -> bool:
    """The known difference pinned by
    ``test_a_host_hit_under_the_threshold_is_loaded_back_upstream_under_hybrid_swa``: under
    hybrid SWA, a host run (whole pages) shorter than ``load_back_threshold``."""
    page = sc.config.page_size
    return sc.config.sliding_window is not None and any(
        0 < r.host_prefix_tokens // page * page < LOAD_BACK_THRESHOLD for r in sc.requests
    )


@pytest.mark.slow
@pytest.mark.parametrize(
    ("hybrid_swa", "count"), [(False, RANDOM_COUNT), (True, RANDOM_SWA_COUNT)], ids=["plain", "swa"]
)
def test_random_scenarios(hybrid_swa, count):
    rng = random.Random(RANDOM_SEED)
    failures = []
    kinds = {
        "host": 0,
        "host-nodes": 0,
        "unpinned-evicted": 0,
        "device": 0,
        "unfit": 0,
        "under-threshold": 0,
    }
    for i in range(count):
        sc = random_scenario(rng, i, hybrid_swa=hybrid_swa)
        if _loads_under_the_threshold(sc):
            kinds["under-threshold"] += 1
            continue
        verdict = conform(sc, storage=True)
        kinds["unfit"] += verdict.not_expressible is not None
        if verdict.differences:
            failures.append(json.dumps(sc.to_dict()) + "\n  " + "\n  ".join(verdict.differences))
        kinds["host"] += any(r.host_prefix_tokens for r in sc.requests)
        kinds["host-nodes"] += not hybrid_swa and bool(host_runs(sc))  # on SGLang's HiCache
        kinds["unpinned-evicted"] += verdict.evicted_prefix
        kinds["device"] += any(r.device_prefix_tokens for r in sc.requests)
    assert not failures, f"{len(failures)}/{count} differ:\n" + "\n".join(failures[:5])
    # a sliding-window pool smaller than a host run's last window: SGLang never is in it
    assert kinds["unfit"] <= count // 20, kinds
    # what the comparison covers: host prefixes (with hybrid SWA too: swa_host_hit_length),
    # and on SGLang's own storage unpinned device prefixes an eviction took while they waited
    assert kinds["host"] >= count // 10, kinds
    if not hybrid_swa:
        assert kinds["unpinned-evicted"] >= count // 50, kinds
        assert kinds["host-nodes"] >= count // 10, kinds
    else:  # on SGLang's own SWA storage: cached windows, locks and sliding-window eviction
        assert kinds["device"] >= count // 4, kinds


# Eviction at admission: r0's host load-back takes its slots at admission, evicting r1's cached
# prefix (the least recently used) before r1 is matched, so upstream computes r1's 600 tokens;
# the planner foresees that eviction (planner.LoadBacks) and the node commits it in that order.
# Round 1 spends the refresh of waiting prefixes (every 32nd sort) on w alone.
LOAD_BACK_EVICTS = scenario(
    16,
    4096,
    656,
    [
        RequestSpec("w", 16),
        RequestSpec("r0", 2000, host_prefix_tokens=800, arrival_round=2),
        RequestSpec("r1", 600, device_prefix_tokens=512, arrival_round=2),
    ],
    evictable=3712,
)
#: the same with every request waiting in round 1: SGLang's first sort refreshes the waiting
#: prefixes (``_touch_waiting_prefixes``), so the load-back evicts idle cache and r1 keeps its hit
REFRESHED = scenario(
    16,
    4096,
    656,
    [
        RequestSpec("w", 16),
        RequestSpec("r0", 2000, host_prefix_tokens=800),
        RequestSpec("r1", 600, device_prefix_tokens=512),
    ],
    evictable=3712,
)
#: SGLang evicts for extend + one page per request (56) though 3 free pages hold r0's 40 tokens
CONSERVATIVE = scenario(16, 4096, 48, [(40,)], evictable=64)
#: r0's two chunks are two tree nodes; r1's demand evicts the later one only
CHUNKS = scenario(
    16, 64, 160, [(128,), RequestSpec("r1", 20, arrival_round=3)], kv_release_rounds=0
)


@pytest.mark.parametrize("name", ["LOAD_BACK_EVICTS", "REFRESHED", "CONSERVATIVE", "CHUNKS"])
def test_storage_cases(name):
    assert_identical(globals()[name])


def test_driver_shows_the_eviction_and_the_refresh():
    from policykit.conformance.sglang.run import drive

    batch = drive(LOAD_BACK_EVICTS).rounds[1].plan.entries
    assert [(e.request_id, e.start, e.end, e.cached) for e in batch] == [
        ("r0", 800, 2000, 0),
        ("r1", 0, 600, 0),
    ]
    batch = drive(REFRESHED).rounds[0].plan.entries
    assert [(e.request_id, e.start, e.cached) for e in batch][1:] == [
        ("r0", 800, 0),
        ("r1", 512, 512),
    ]


def test_driver_reports_sglangs_storage():
    from policykit.conformance.sglang.run import drive

    run = drive(CONSERVATIVE)
    assert run.rounds[0].storage == {"free": 64, "evictable": 0, "cached": {}}
    run = drive(CHUNKS)
    assert run.rounds[2].storage == {"free": 64, "evictable": 64, "cached": {"r0": 64}}


# SGLang's own host tier (HiCache: init_hicache, HybridCacheController, host-only nodes,
# load_back with its threshold), the copies left out. r0's unpinned 256-token prefix and its
# 512-token host run are host nodes; w's 1020 tokens evict the prefix from the device, which
# demotes it (backed up, as HiCache backs a node's ancestors up first): r0 then loads all 768
# back from token 0. After r0's release its KV is three nodes (prefix, host run, its own), and
# r1's demand evicts the last two only.
HOST_PREFIX_EVICTED = scenario(
    16,
    4096,
    1024,
    [
        RequestSpec("w", 1020),
        RequestSpec("r0", 1200, device_prefix_tokens=256, host_prefix_tokens=512, arrival_round=2),
        RequestSpec("r1", 900, arrival_round=4),
    ],
    evictable=256,
    kv_release_rounds=0,
)


def test_host_prefix_cases():
    assert_identical(HOST_PREFIX_EVICTED)


def test_driver_runs_sglangs_host_tier():
    from policykit.conformance.sglang.storage_driver import StorageDriver

    driver = StorageDriver(HOST_PREFIX_EVICTED)
    controller = driver.cache.cache_controller
    assert type(controller).__name__ == "HybridCacheController"
    assert driver.cache.load_back_threshold == LOAD_BACK_THRESHOLD  # SGLang's own value
    host = controller.mem_pool_host
    assert host.size - host.available_size() == 768  # r0's prefix and host run, backed up
    run = driver.run(100)
    loads = [(e.request_id, e.cached, e.load_back) for r in run.rounds for e in r.plan.entries]
    assert ("r0", 0, 768) in loads
    assert host.size - host.available_size() == 768  # a load-back keeps the host copy
    # r1's demand took r0's own KV and its host run's node, and stopped at r0's prefix
    assert run.rounds[3].storage["cached"] == {"r0": 256}


def test_a_backed_up_node_under_one_that_is_not_panics_the_tree_core():
    """Why the layout backs a host run's device prefix up first: SGLang 0.5.23's compiled tree
    core assumes a backed-up node's ancestors are backed up (its own backups go parent first),
    and panics when eviction reaches a parent that is not, above a demoted child."""
    from array import array

    import torch

    from policykit.conformance.sglang.storage import Storage
    from policykit.conformance.sglang.storage_driver import StorageDriver

    driver = StorageDriver(HOST_PREFIX_EVICTED)
    st: Storage = driver.storage
    s, tree = st.s, st.tree
    parent = tuple(range(1, 17))
    child = (*parent, *range(17, 49))
    slots = st.alloc_seq(torch.empty((0,), dtype=torch.int64), 48)
    tree.insert(s["InsertParams"](key=s["RadixKey"](array("q", parent)), value=slots[:16]))
    tree.insert(
        s["InsertParams"](key=s["RadixKey"](array("q", child)), value=slots, prev_prefix_len=16)
    )
    node = tree.match_prefix(s["MatchPrefixParams"](key=s["RadixKey"](array("q", child))))
    assert tree.backup_node_for_write_back(node.last_device_node)  # the child alone
    with pytest.raises(RuntimeError, match="panicked"):
        tree.evict(s["EvictParams"](num_tokens=tree.evictable_size()))


# Hybrid SWA: SGLang 0.5.23's SWAPrefillBudget. The issue's example: r0 can never fit the
# 608-slot sliding-window pool whole (window-capped estimate 1569), so its first chunk is capped
# at 608 - (1 + 16) floored to pages = 576; the resume then takes remaining_swa - page = 16,
# and is deferred once that is 0.
SWA_SHORTAGE = scenario(
    16, 789, 9008, [(1539,)], evictable=1344, swa_free_tokens=608, sliding_window=4096
)


def swa(page, chunk, free, requests, swa_free, window, **kw) -> Scenario:
    return scenario(
        page, chunk, free, requests, swa_free_tokens=swa_free, sliding_window=window, **kw
    )


SWA_EDGES = {
    "never-fits-capped": SWA_SHORTAGE,
    # r1's estimate (ceil 704 - window 512 + window 512 + page 16 = 720) does not fit the 683
    # r0 left, though it fits an empty pool: a transient shortage, so it waits with NO_TOKEN
    # until r0's release frees its window
    "transient-shortage-waits": swa(
        16, 4096, 16 * 1000, [(400,), (700,)], 1100, 512, kv_release_rounds=1
    ),
    # r1's estimate (896 + first token + page) equals what r0 left (1000 - 102): it must be
    # strictly less, so r1 waits; one token shorter, it enters
    "estimate-equals-remaining": swa(1, 4096, 5000, [(100,), (896,)], 1000, 4096),
    "estimate-one-below": swa(1, 4096, 5000, [(100,), (895,)], 1000, 4096),
    # a long prompt over a short window: only the window part is capped, the rest is charged
    "long-prompt-short-window": swa(64, 2048, 64 * 400, [(6000,), (300,)], 4096, 128),
    # the resume is capped at remaining_swa - page, then deferred at <= 0
    "resume-capped": swa(
        64, 2048, 64 * 400, [RequestSpec("r0", 5000, computed_tokens=1000, chunked=True)], 200, 512
    ),
    "resume-deferred": swa(
        64, 2048, 64 * 400, [RequestSpec("r0", 5000, computed_tokens=1000, chunked=True)], 64, 512
    ),
    # the ledger charges chunk + first token + page (302, 202), not chunk + page (301, 201):
    # r2's estimate 102 then equals what is left, and it waits
    "ledger-charge": swa(1, 1000, 5000, [(300,), (200,), (100,)], 606, 512),
}


@pytest.mark.parametrize("name", sorted(SWA_EDGES))
def test_swa_edge_cases(name):
    assert_identical(SWA_EDGES[name])


def test_swa_driver_reports_upstreams_chunk():
    """The issue's example: upstream computes [0, 576) where the pre-fix model says 784."""
    from policykit.conformance.sglang.run import drive

    run = drive(SWA_SHORTAGE)
    first = run.rounds[0].plan.entries[0]
    assert (first.start, first.end) == (0, 576)
    assert run.oom is None


# Hybrid SWA with a host hit: SGLang 0.5.23 charges the hit's sliding-window KV
# (swa_host_hit_length, the whole 512-token host run) on top of the chunk's estimate. r0's
# 488 tokens to compute are estimated 497 + page 16 = 513, plus 512: 1025 never fits the
# 1008-slot pool (63 pages), so the chunk is capped at (1008 - 17 - 512) floored to pages = 464.
SWA_HOST_CAPPED = swa(
    16, 4096, 16 * 400, [RequestSpec("r0", 1000, host_prefix_tokens=512)], 1008, 4096
)
SWA_HOST_EDGES = {
    "host-charge-caps-the-chunk": SWA_HOST_CAPPED,
    # 1025 < 1100: whole
    "host-charge-fits": swa(
        16, 4096, 16 * 400, [RequestSpec("r0", 1000, host_prefix_tokens=512)], 1100, 4096
    ),
    # r0's load-back takes 512 sliding-window slots at admission and its 88 tokens reserve 113:
    # r1's estimate 577 is over the 575 left, so it waits (1087 would be left without the load)
    "load-back-takes-window-slots": swa(
        16,
        4096,
        16 * 400,
        [RequestSpec("r0", 600, host_prefix_tokens=512), (560,)],
        1200,
        4096,
        kv_release_rounds=1,
    ),
    # a short window: the charge is the whole host run, not one window (0.5.23 does not cap it)
    "host-run-longer-than-window": swa(
        64, 8192, 64 * 200, [RequestSpec("r0", 3000, host_prefix_tokens=2048)], 2600, 128
    ),
}


@pytest.mark.parametrize("name", sorted(SWA_HOST_EDGES))
def test_swa_host_edge_cases(name):
    assert_identical(SWA_HOST_EDGES[name])


def test_upstream_charges_the_sliding_window_part_of_a_host_hit():
    from policykit.conformance.sglang.run import drive

    first = drive(SWA_HOST_CAPPED).rounds[0].plan.entries[0]
    assert (first.start, first.end, first.load_back) == (512, 512 + 464, 512)
    waits = drive(SWA_HOST_EDGES["load-back-takes-window-slots"]).rounds[0]
    assert [e.request_id for e in waits.plan.entries] == ["r0"]
    assert waits.verdicts == [("r0", "CONTINUE"), ("r1", "NO_TOKEN")]


# SGLang 0.5.23's own HiCache with hybrid SWA: a sliding-window host pool beside the full one,
# each host run backed up with its window by the SWA component, then demoted to host-only
# nodes. SGLang's tree walk derives the run's last window as swa_host_hit_length, and its
# load-back brings back that much sliding-window KV, as policykit models it
# (policykit.host_tier.swa_host_hit).
SWA_HICACHE_AGREES = (
    "host-charge-caps-the-chunk",
    "host-charge-fits",
    "load-back-takes-window-slots",
    "host-run-longer-than-window",
)


@pytest.mark.parametrize("name", SWA_HICACHE_AGREES)
def test_swa_host_edge_cases_on_sglangs_hicache(name):
    verdict = conform(SWA_HOST_EDGES[name], storage=True)
    assert verdict.differences == [], verdict.differences


def _first_match(driver, rid: str):
    """SGLang's match of ``rid``'s prompt on the tree as laid out (before any round)."""
    s = driver.up["storage"]
    key = s["RadixKey"](array("q", driver.requests[rid].tokens))
    return driver.cache.match_prefix(s["MatchPrefixParams"](key=key))


def test_the_driver_runs_sglangs_swa_hicache():
    from policykit.conformance.sglang.storage_driver import StorageDriver

    driver = StorageDriver(SWA_HOST_CAPPED)
    cache = driver.cache
    assert type(cache.cache_controller).__name__ == "HybridCacheController"
    assert cache.tree_core.has_swa_host_pool
    pools = {name.value: entry.host_pool for name, entry in cache.host_pool_group.entry_map.items()}
    # the run's full KV and its sliding-window KV, each backed up on its own host pool
    assert {name: p.size - p.available_size() for name, p in pools.items()} == {
        "kv": 512,
        "swa": 512,
    }
    match = _first_match(driver, "r0")
    assert (match.device_prefix_len, match.host_hit_length, match.swa_host_hit_length) == (
        0,
        512,
        512,
    )
    first = driver.run().rounds[0].plan.entries[0]
    assert (first.start, first.end, first.load_back) == (512, 512 + 464, 512)


# A host run four windows long: SGLang's insert cuts a new leaf at one window (1920 + 128
# tokens here), backs both up, and its tree walk stops once a window is covered, so
# swa_host_hit_length is 128 and the load-back takes 128 sliding-window slots beside its 2048
# full ones. policykit charges and takes the same (it charged the whole run before SGLang's own
# HiCache showed it).
def test_sglangs_swa_hicache_loads_one_window_of_a_long_host_run():
    from policykit.conformance.sglang.storage_driver import StorageDriver

    long_run = SWA_HOST_EDGES["host-run-longer-than-window"]
    driver = StorageDriver(long_run)
    match = _first_match(driver, "r0")
    assert (match.host_hit_length, match.swa_host_hit_length) == (2048, 128)
    pools = driver.allocator
    assert (pools.full_available_size(), pools.swa_available_size()) == (12800, 2560)
    driver.run(1)
    # the load-back takes 2048 full slots but one window (128) of sliding-window slots, and
    # r0's 952 tokens 15 pages (960) in each pool
    assert (pools.full_available_size(), pools.swa_available_size()) == (
        12800 - 2048 - 960,
        2560 - 128 - 960,
    )
    node = build_node(long_run)
    (entry,) = Scheduler(node, builtin_registry().resolve("sglang/sglang/none")).step().plan.batch
    assert (entry.start, entry.end, entry.load_back) == (2048, 3000, 2048)
    assert (node.pool.free_tokens, node.swa_pool.free_tokens) == (
        12800 - 2048 - 960,
        2560 - 128 - 960,
    )


@pytest.mark.slow
def test_random_swa_host_scenarios_on_sglangs_hicache():
    """CI's hybrid-SWA random set, the scenarios with host runs, on SGLang's own SWA HiCache:
    identical, whether a run fits in one window or not (or not expressible: a run whose last
    window is more than the sliding-window pool)."""
    rng = random.Random(RANDOM_SEED)
    kinds = {"fit": 0, "long": 0, "unfit": 0}
    failures = []
    for i in range(RANDOM_SWA_COUNT):
        sc = random_scenario(rng, i, hybrid_swa=True)
        runs = host_runs(sc)
        if not runs or _loads_under_the_threshold(sc):
            continue
        verdict = conform(sc, storage=True)
        if verdict.not_expressible is not None:
            kinds["unfit"] += 1
            continue
        fits = all(device + host <= sc.config.sliding_window for _, device, host in runs)
        kinds["fit" if fits else "long"] += 1
        if verdict.differences:
            failures.append(json.dumps(sc.to_dict()) + "\n  " + verdict.differences[0])
    assert not failures, "\n".join(failures[:5])
    assert kinds["fit"] >= 10 and kinds["long"] >= 5, kinds


def test_the_last_window_of_a_host_run_must_have_fit_the_sliding_window_pool():
    """HiCache backs up what was live on the device: a host run keeps at least its last window
    of sliding-window KV, and a 4096-token window of it could never have been in the 1504-token
    sliding-window pool (992 free in whole pages, and r0's cached window of 512)."""
    r0 = RequestSpec("r0", 5000, 864, host_prefix_tokens=3904)
    sc = swa(16, 4096, 16 * 400, [r0], 1000, 4096, evictable=864)
    verdict = conform(sc, storage=True)
    assert verdict.status == "not expressible" and not verdict.differences
    assert verdict.not_expressible.startswith("the last window of request r0's host run")


def test_a_host_run_longer_than_the_sliding_window_pool_keeps_its_last_window():
    """The same run as a chunked request leaves it: only its last window (512) of
    sliding-window KV backed up, which the pool holds; both sides agree."""
    r0 = RequestSpec("r0", 3000, 864, host_prefix_tokens=1904)
    sc = swa(16, 4096, 16 * 400, [r0], 1000, 512, evictable=864)
    assert conform(sc, storage=True).differences == []


# Known difference kept on purpose (docs/conformance.md): with one-token pages, a host hit under
# HiCache's load-back threshold (10 tokens). Under hybrid SWA SGLang's load-back declines a
# short hit only when no component has KV to load with it, and the sliding-window one always
# has, so it loads the 5-token hit back (r1 waits a round for its sliding-window room, then
# runs from token 5); policykit recomputes it, as without hybrid SWA.
UNDER_THRESHOLD_SWA_HOST = swa(
    1, 4096, 5000, [(60,), RequestSpec("r1", 130, host_prefix_tokens=5)], 194, 128
)


def test_a_host_hit_under_the_threshold_is_loaded_back_upstream_under_hybrid_swa():
    from policykit.conformance.sglang.run import drive

    verdict = conform(UNDER_THRESHOLD_SWA_HOST, storage=True)
    assert verdict.differences[:2] == [
        "round 1 batch: policykit [('r0', 0, 60, 'whole'), ('r1', 0, 130, 'whole')] != "
        "upstream [('r0', 0, 60, 'whole')]",
        "round 2 batch: policykit [] != upstream [('r1', 5, 130, 'whole')]",
    ]
    entries = [e for r in drive(UNDER_THRESHOLD_SWA_HOST).rounds for e in r.plan.entries]
    assert [e.load_back for e in entries if e.request_id == "r1" and e.kind.is_new] == [5]


# SGLang 0.5.23's own SWA storage (SWAKVPool, SWATokenToKVPoolAllocator, the SWA tree
# component): r1's allocation is short of sliding-window slots, and SGLang evicts the cached
# leaf that holds r0's window, its full KV included, leaving the tombstone below it. policykit's
# node keeps sliding-window KV in its tree the same way (policykit.swa_cache), so both sides
# hold 128 of r0's tokens after round 1, and r0, whose window is gone, matches nothing.
SWA_LEAF_EVICTED = swa(
    16,
    4096,
    4096,
    [RequestSpec("r0", 400, device_prefix_tokens=256, arrival_round=5), (200,)],
    128,
    128,
    evictable=256,
)


def first_of(run, rid: str):
    """``rid``'s first batch entry in ``run``."""
    return next(e for r in run.rounds for e in r.plan.entries if e.request_id == rid)


def test_sglangs_swa_storage_evicts_a_full_leaf_for_sliding_window_slots():
    from policykit.conformance.sglang.compare import run_policykit
    from policykit.conformance.sglang.storage_driver import StorageDriver

    driver = StorageDriver(SWA_LEAF_EVICTED)
    assert type(driver.storage.allocator).__name__ == "SWATokenToKVPoolAllocator"
    assert type(driver.storage.allocator.get_kvcache()).__name__ == "SWAKVPool"
    assert driver.cache.is_swa_enabled
    run = driver.run()
    assert run.rounds[0].storage["cached"] == {"r0": 128}
    assert first_of(run, "r0").cached == 0
    views: list = []
    ours = run_policykit(SWA_LEAF_EVICTED, storage=views)
    assert views[0]["cached"] == {"r0": 128}
    assert first_of(ours, "r0").cached == 0
    assert conform(SWA_LEAF_EVICTED, storage=True).differences == []
