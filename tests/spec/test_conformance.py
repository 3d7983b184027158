"""The z3 encoding of the scheduler core agrees with the concrete planner and node.

Random concrete states (pool, pinned and unpinned device prefixes, host prefixes, arrivals,
release delay, hybrid SWA) are run through the real ``Scheduler`` and through
``policykit.spec.bmc`` with every input fixed; entries, ledger marks, verdicts and the OOM
round must be identical. Every built-in combo is covered, with the profile's number of
examples each (200 in ``ci``): each combo's encoding is built once per configuration and each
example is *evaluated* on it
(``tests.spec.replay``), not solved, which is what makes that many examples affordable.
"""

from __future__ import annotations

import pytest
import z3
from hypothesis import example, given
from hypothesis import strategies as st

from policykit.config import EngineConfig
from policykit.host_tier import LOAD_BACK_THRESHOLD
from policykit.plugin_manager import make_plugin_manager
from policykit.registry import PolicyRegistry
from policykit.spec.counterexample import scenario_of
from tests.spec.replay import MAX_REQUESTS, concrete_rounds, model_rounds, unrolling

ROUNDS = 4
#: (page, chunk, sliding window, max_prefill_tokens): each is one encoding per combo, so few
#: and varied. The hybrid one runs the node's SWA radix tree (SGLang 0.5.23's) against the
#: model's account of it (``policykit.spec.swa``)
CONFIGS = [(16, 256, None, None), (64, 4096, None, 512), (64, 256, 128, None)]
#: every admission, chunking and alignment with the default queue (``fcfs``); the other queues
#: on a few combos below (``lpm`` needs scenarios listed in its order)
COMBOS = [
    str(c)
    for c in PolicyRegistry.from_plugins(make_plugin_manager(entry_points=False)).all_combos(
        EngineConfig(64, 4096), kinds=("admission", "chunking", "alignment")
    )
]


@st.composite
def scenarios(draw: st.DrawFn, unpinned: bool = True) -> dict:
    """A random scenario; its device prefixes are pinned or (with ``unpinned``) not, and the
    unpinned ones are part of the evictable tokens, on top of a random filler."""
    page, chunk, window, max_prefill = draw(st.sampled_from(CONFIGS))
    n = draw(st.integers(1, MAX_REQUESTS))
    pool = {
        "free_tokens": draw(st.integers(1, 60)) * page,
        "evictable_tokens": draw(st.integers(0, 20)) * page,
    }
    # prompts the pool can hold (``arrive`` refuses larger ones; the model assumes none)
    largest = min(1500, pool["free_tokens"] + pool["evictable_tokens"])
    requests = []
    arrival = 1
    for i in range(n):
        prompt = draw(st.integers(1, largest))
        device = draw(st.integers(0, (prompt - 1) // page)) * page
        host = draw(st.integers(0, prompt - device - 1))
        arrival = draw(st.integers(arrival, ROUNDS))
        item = {"id": "ABC"[i], "prompt_tokens": prompt, "arrival_round": arrival}
        if device and unpinned and draw(st.booleans()):
            item["device_prefix_tokens"] = device
            pool["evictable_tokens"] += device
        elif device:
            item |= {"device_prefix_tokens": device, "device_prefix_pinned": True}
        if host:
            item["host_prefix_tokens"] = host
        requests.append(item)
    if window is not None:
        pool["swa_free_tokens"] = draw(st.integers(page, 3000))
        pool["sliding_window"] = window
    return {
        "page_size": page,
        "chunked_prefill_size": chunk,
        "max_prefill_tokens": max_prefill,
        "pool": pool,
        "kv_release_rounds": draw(st.none() | st.integers(0, 2)),
        "requests": requests,
    }


def _fits(scenario: dict) -> bool:
    """``arrive`` refuses prompts larger than the pool; the model assumes none are."""
    page, pool = scenario["page_size"], scenario["pool"]
    total = pool["free_tokens"] + pool["evictable_tokens"]
    total += sum(
        r["device_prefix_tokens"] for r in scenario["requests"] if r.get("device_prefix_pinned")
    )
    return all(-(-r["prompt_tokens"] // page) * page <= total for r in scenario["requests"])


def _host_run_outlasts_the_window(scenario: dict) -> bool:
    """A known approximation of the model (docs/conformance.md): an unpinned device prefix
    with a host run of a window and a page or more after it. SGLang's match then refreshes the
    sliding-window LRU from the end of the host run, which leaves the prefix as old as it was,
    and the node does the same node by node; the model keeps one sliding-window stamp per
    request's cached KV, so once the request is released its whole unit is new again, the
    prefix included (pinned by ``test_the_model_refreshes_a_released_unit_whole``)."""
    window = scenario["pool"].get("sliding_window")
    if window is None:
        return False
    page = scenario["page_size"]
    return any(
        r.get("device_prefix_tokens")
        and not r.get("device_prefix_pinned")
        and r.get("host_prefix_tokens", 0) // page * page >= window + page
        for r in scenario["requests"]
    )


SEED_ABC = {
    "page_size": 64,
    "chunked_prefill_size": 4096,
    "pool": {"free_tokens": 12032, "evictable_tokens": 0},
    "kv_release_rounds": None,
    "requests": [
        {"id": "A", "prompt_tokens": 1088},
        {"id": "B", "prompt_tokens": 8000},
        {"id": "C", "prompt_tokens": 6128, "host_prefix_tokens": 6000},
    ],
}

#: found by ``policykit check`` for sglang+sglang+checkpoint:256 (no-oom, round 3): B is
#: truncated at 256, C loads back 640 tokens into B's unreserved tail
#: found by this test after the planner learnt to skip requests that can never fit: a 1-token
#: prompt that sglang admission refuses even on an idle 16-token pool (1 + 1 + 16 >= 16)
NEVER_FITS = {
    "page_size": 16,
    "chunked_prefill_size": 256,
    "pool": {"free_tokens": 16, "evictable_tokens": 0},
    "kv_release_rounds": None,
    "requests": [{"id": "A", "prompt_tokens": 1, "arrival_round": 1}],
}

Z3_SEED_000 = {
    "page_size": 64,
    "chunked_prefill_size": 4096,
    "pool": {"free_tokens": 4928, "evictable_tokens": 0},
    "kv_release_rounds": None,
    "requests": [
        {"id": "A", "prompt_tokens": 3904},
        {
            "id": "B",
            "prompt_tokens": 1024,
            "device_prefix_tokens": 192,
            "device_prefix_pinned": True,
        },
        {"id": "C", "prompt_tokens": 704, "host_prefix_tokens": 640},
    ],
}


#: found by this test after the scheduler learnt to fail an in-progress request deferred on an
#: otherwise empty node: A's first 64 tokens fill half the 128-token sliding-window pool,
#: ``swa-reserve`` defers its last token forever, and the scheduler fails A in round 2 (with
#: ``no-evict`` admission: the others refuse A, whose estimate does not fit the paged pool)
STUCK_ON_SWA = {
    "page_size": 64,
    "chunked_prefill_size": 256,
    "pool": {
        "free_tokens": 0,
        "evictable_tokens": 256,
        "swa_free_tokens": 128,
        "sliding_window": 128,
    },
    "kv_release_rounds": None,
    "requests": [
        {"id": "A", "prompt_tokens": 65, "arrival_round": 1},
        {"id": "B", "prompt_tokens": 1, "arrival_round": 1},
        {"id": "C", "prompt_tokens": 1, "arrival_round": 3},
    ],
}


#: never-fits is asked of an idle node: the pool minus pinned prefixes (policykit.liveness),
#: not what is free now, and not the whole pool. A is held for good; in round 2 B is larger
#: than the pool minus B's and C's pinned prefixes (rejected for good) though not larger than
#: the pool, and C does not fit what is free now but would fit an idle node (not rejected)
IDLE_NOT_NOW = {
    "page_size": 64,
    "chunked_prefill_size": 4096,
    "pool": {"free_tokens": 1024, "evictable_tokens": 256},
    "kv_release_rounds": None,
    "requests": [
        {"id": "A", "prompt_tokens": 700, "arrival_round": 1},
        {
            "id": "B",
            "prompt_tokens": 1400,
            "device_prefix_tokens": 64,
            "device_prefix_pinned": True,
            "arrival_round": 2,
        },
        {
            "id": "C",
            "prompt_tokens": 1000,
            "device_prefix_tokens": 128,
            "device_prefix_pinned": True,
            "arrival_round": 2,
        },
    ],
}


#: the input budget spent by A's 640-token chunk: B waits for the next round (Budget.OTHER)
INPUT_BUDGET = {
    "page_size": 64,
    "chunked_prefill_size": 4096,
    "max_prefill_tokens": 512,
    "pool": {"free_tokens": 4096, "evictable_tokens": 0},
    "kv_release_rounds": None,
    "requests": [
        {"id": "A", "prompt_tokens": 600, "arrival_round": 1},
        {"id": "B", "prompt_tokens": 64, "arrival_round": 1},
    ],
}


#: unpinned device prefixes (docs/spec.md "Unpinned device prefixes"). ``no-evict`` counts the
#: whole prompt, cached or not: locking A's 256-token prefix takes it out of the 768-token
#: baseline and A no longer fits (705 > 512), so A is asked about afresh and computes all 600
#: tokens from 0, while ``sglang`` admission credits the prefix and A starts at 256
LOCK_REFUSED = {
    "page_size": 64,
    "chunked_prefill_size": 4096,
    "pool": {"free_tokens": 512, "evictable_tokens": 256},
    "kv_release_rounds": None,
    "requests": [{"id": "A", "prompt_tokens": 600, "device_prefix_tokens": 256}],
}

#: A's 600 tokens make an eviction demand of 664 (SGLang evicts for extend + one page per
#: request), 152 more than is free; the least recently used node goes first, and B has not
#: arrived, so that is B's prefix (laid out before the filler): in round 2 B has no device
#: hit, but the host holds its evicted prefix with the host prefix after it (HiCache backs a
#: node's ancestors up first), so B loads 256 tokens back from token 0
EVICTED_WHILE_WAITING = {
    "page_size": 64,
    "chunked_prefill_size": 4096,
    "pool": {"free_tokens": 512, "evictable_tokens": 256},
    "kv_release_rounds": 0,
    "requests": [
        {"id": "A", "prompt_tokens": 600, "arrival_round": 1},
        {
            "id": "B",
            "prompt_tokens": 500,
            "device_prefix_tokens": 128,
            "host_prefix_tokens": 128,
            "arrival_round": 2,
        },
    ],
}

#: the same without B's host prefix: B's evicted prefix is nowhere, and B computes from 0
EVICTED_NO_HOST = {
    **EVICTED_WHILE_WAITING,
    "requests": [
        EVICTED_WHILE_WAITING["requests"][0],
        {**EVICTED_WHILE_WAITING["requests"][1], "host_prefix_tokens": 0},
    ],
}

#: the same, but B arrives in round 1 and A is 560 tokens: the refresh of waiting prefixes and
#: then the queue loop touch B's prefix (B is refused), so the commit's eviction, for A's
#: 560 + one page = 624 tokens (112 more than is free), takes the filler alone and B starts at
#: 256 in round 2 (its 128-token prefix, then 128 loaded back)
TOUCHED_SURVIVES = {
    **EVICTED_WHILE_WAITING,
    "requests": [
        {**EVICTED_WHILE_WAITING["requests"][0], "prompt_tokens": 560},
        {**EVICTED_WHILE_WAITING["requests"][1], "arrival_round": 1},
    ],
}

#: SGLang's eviction at load-back (issue 13 item 8): A's 256-token load-back is 128 short of
#: the free list and evicts the least recently used cache. The first sort of a non-empty queue
#: refreshes the waiting prefixes (SGLang's ``_touch_waiting_prefixes``), so B's prefix is newer
#: than the filler: the filler goes and B keeps its 128-token hit
REFRESHED_SURVIVES_LOAD_BACK = {
    "page_size": 64,
    "chunked_prefill_size": 4096,
    "pool": {"free_tokens": 128, "evictable_tokens": 576},
    "kv_release_rounds": None,
    "requests": [
        {"id": "A", "prompt_tokens": 300, "host_prefix_tokens": 256},
        {"id": "B", "prompt_tokens": 200, "device_prefix_tokens": 128},
    ],
}
#: the same after a round that spent the refresh on C alone (the next is 32 sorts later): B's
#: prefix (laid out before the filler) is the oldest, A's load-back evicts it before B is
#: matched, so B is asked about with no hit in the same round
EVICTED_BY_LOAD_BACK = {
    **REFRESHED_SURVIVES_LOAD_BACK,
    "pool": {"free_tokens": 192, "evictable_tokens": 576},
    "requests": [
        {"id": "C", "prompt_tokens": 60},
        *(
            {**r, "arrival_round": 2}
            for r in REFRESHED_SURVIVES_LOAD_BACK["requests"]  # type: ignore[attr-defined]
        ),
    ],
}


#: each combo's run takes some seconds: the fast tier runs one (SGLang's own), the slow tier
#: (``-m slow``) the rest
FAST_COMBOS = ("sglang/sglang/none",)


def _slow_but(combos, fast) -> list:
    return [c if c in fast else pytest.param(c, marks=pytest.mark.slow) for c in combos]


@pytest.mark.parametrize("combo_text", _slow_but(COMBOS, FAST_COMBOS))
@example(scenario=LOCK_REFUSED)
@example(scenario=EVICTED_WHILE_WAITING)
@example(scenario=EVICTED_NO_HOST)
@example(scenario=TOUCHED_SURVIVES)
@example(scenario=EVICTED_BY_LOAD_BACK)
@example(scenario=REFRESHED_SURVIVES_LOAD_BACK)
@example(scenario=SEED_ABC)
@example(scenario=INPUT_BUDGET)
@example(scenario=IDLE_NOT_NOW)
@example(scenario=Z3_SEED_000)
@example(scenario=NEVER_FITS)
@example(scenario=STUCK_ON_SWA)
@given(scenario=scenarios())
def test_encoding_matches_the_scheduler(registry, combo_text: str, scenario: dict) -> None:
    if not _fits(scenario) or _host_run_outlasts_the_window(scenario):
        return
    combo = registry.resolve(combo_text)
    concrete, concrete_oom = concrete_rounds(scenario, combo, ROUNDS)
    modelled, model_oom = model_rounds(scenario, combo, ROUNDS)
    assert concrete_oom == model_oom
    for k, (real, sym) in enumerate(zip(concrete, modelled, strict=False), start=1):
        assert real == sym, f"round {k} differs"
    if concrete_oom is None:  # the real run stopped idle: nothing may be placed after it
        for rows, marks in modelled[len(concrete) :]:
            assert not marks, f"the model places {rows} after the run went idle"


#: The sliding-window pool is paged (SGLang 0.5.23 pairs every full page with a
#: sliding-window one): the 129 free sliding-window tokens are two pages (128), where A's
#: estimate (129) does not fit. The model counts whole pages as the node does.
SWA_POOL_IN_PAGES = {
    "page_size": 64,
    "chunked_prefill_size": 256,
    "max_prefill_tokens": None,
    "pool": {
        "free_tokens": 64,
        "evictable_tokens": 64,
        "swa_free_tokens": 129,
        "sliding_window": 128,
    },
    "kv_release_rounds": None,
    "requests": [{"id": "A", "prompt_tokens": 1, "arrival_round": 1}],
}


def test_the_sliding_window_pool_is_paged_in_the_model_too(registry) -> None:
    combo = registry.resolve("sglang/defer/truncation:192")
    concrete, _ = concrete_rounds(SWA_POOL_IN_PAGES, combo, 1)
    modelled, _ = model_rounds(SWA_POOL_IN_PAGES, combo, 1)
    assert concrete[0][0] == [("A", "rejected NO_TOKEN", 0, 0, 0)]
    assert modelled[0][0] == concrete[0][0]


def test_a_spent_input_budget_stops_the_queue_in_the_model_too(registry) -> None:
    combo = registry.resolve("admission=reserve-tail,chunking=sglang,alignment=page")
    concrete, _ = concrete_rounds(INPUT_BUDGET, combo, 2)
    assert [row[0] for row in concrete[0][0]] == ["A"]  # B is not looked at in round 1
    assert [row[0] for row in concrete[1][0]] == ["B"]
    assert concrete == model_rounds(INPUT_BUDGET, combo, 2)[0]


def test_never_fits_measures_the_idle_node_not_the_pool_or_what_is_free_now(registry) -> None:
    # only a skipping queue rejects a request for good (NEVER); fcfs stops at it
    combo = registry.resolve("admission=reserve-tail,chunking=defer,alignment=page,queue=fcfs-skip")
    concrete, _ = concrete_rounds(IDLE_NOT_NOW, combo, 2)
    rows = {row[0]: row[1] for row in concrete[1][0]}
    assert rows["B"] == "rejected NEVER"
    assert rows.get("C") != "rejected NEVER"
    assert concrete == model_rounds(IDLE_NOT_NOW, combo, 2)[0]


def _starts(scenario: dict, combo_text: str, registry) -> list[dict[str, int]]:
    """Per round, where each placed request starts (the real run, after checking that the
    encoding agrees with it)."""
    combo = registry.resolve(combo_text)
    concrete, oom = concrete_rounds(scenario, combo, ROUNDS)
    modelled, model_oom = model_rounds(scenario, combo, ROUNDS)
    assert (concrete, oom) == (modelled[: len(concrete)], model_oom)
    return [{row[0]: row[2] for row in rows if row[1] == "whole"} for rows, _ in concrete]


def test_a_lock_that_refuses_the_request_reselects_it_without_its_prefix(registry) -> None:
    assert _starts(LOCK_REFUSED, "sglang/sglang/none", registry)[0] == {"A": 256}
    assert _starts(LOCK_REFUSED, "no-evict/sglang/none", registry)[0] == {"A": 0}


def test_eviction_takes_the_least_recently_used_prefix_of_a_waiting_request(registry) -> None:
    assert _starts(EVICTED_NO_HOST, "sglang/sglang/none", registry)[1] == {"B": 0}
    assert _starts(EVICTED_WHILE_WAITING, "sglang/sglang/none", registry)[1] == {"B": 256}
    assert _starts(TOUCHED_SURVIVES, "sglang/sglang/none", registry)[1] == {"B": 256}


def test_a_load_back_evicts_the_prefix_a_later_request_of_the_round_would_hit(registry) -> None:
    assert _starts(EVICTED_BY_LOAD_BACK, "sglang/sglang/none", registry)[1] == {"A": 256, "B": 0}


def test_the_refresh_of_waiting_prefixes_keeps_them_over_idle_cache(registry) -> None:
    starts = _starts(REFRESHED_SURVIVES_LOAD_BACK, "sglang/sglang/none", registry)
    assert starts[0] == {"A": 256, "B": 128}


#: the queue policies other than the default (SGLang's own ``fcfs``, its head blocks the queue),
#: on a few combos: policykit's ``fcfs-skip`` on the scenarios above, and ``lpm``, whose order
#: numbers the model's requests by priority, on scenarios listed in that order
SKIP_COMBOS = [
    "sglang/sglang/none/default/fcfs-skip",
    "reserve-tail/sglang/page/default/fcfs-skip",
]
LPM_COMBOS = ["sglang/sglang/page/default/lpm", "reserve-tail/defer/checkpoint:256/default/lpm"]


def _loadable(host: int, page: int) -> int:
    """``HostTier.loadable``: whole pages, none under the load-back threshold."""
    paged = host // page * page
    return paged if paged >= LOAD_BACK_THRESHOLD else 0


@st.composite
def in_lpm_order(draw: st.DrawFn) -> dict:
    """A scenario whose requests are listed in ``lpm``'s order (longest cached prefix first,
    then arrival), arrivals in any order. Its device prefixes are pinned: the model takes none
    unpinned under a sorting queue (eviction would change the order between rounds)."""
    scenario = draw(scenarios(unpinned=False))
    page = scenario["page_size"]
    requests = scenario["requests"]
    for r in requests:
        r["arrival_round"] = draw(st.integers(1, ROUNDS))
    requests.sort(
        key=lambda r: (
            -(r.get("device_prefix_tokens", 0) + _loadable(r.get("host_prefix_tokens", 0), page)),
            r["arrival_round"],
        )
    )
    for r, name in zip(requests, "ABC", strict=False):
        r["id"] = name
    return scenario


@pytest.mark.parametrize("combo_text", _slow_but(SKIP_COMBOS, ()))
@example(scenario=NEVER_FITS)
@given(scenario=scenarios())
def test_fcfs_skip_matches_the_scheduler(registry, combo_text: str, scenario: dict) -> None:
    test_encoding_matches_the_scheduler.hypothesis.inner_test(registry, combo_text, scenario)


@pytest.mark.parametrize("combo_text", _slow_but(LPM_COMBOS, ()))
@given(scenario=in_lpm_order())
def test_lpm_matches_the_scheduler(registry, combo_text: str, scenario: dict) -> None:
    test_encoding_matches_the_scheduler.hypothesis.inner_test(registry, combo_text, scenario)


def test_a_counterexample_exports_unpinned_prefixes_as_evictable(registry) -> None:
    """``scenario_of`` writes an unpinned prefix without ``device_prefix_pinned``, inside the
    evictable tokens, and the scenario replays to the same rounds as the model's."""
    combo = registry.resolve("sglang/sglang/none")
    config = EngineConfig(64, 4096)
    u = unrolling(combo, config, ROUNDS).u
    inp = u.inputs
    given = {**EVICTED_WHILE_WAITING, "requests": [*EVICTED_WHILE_WAITING["requests"]]}
    given["requests"].append({"id": "C", "prompt_tokens": 1, "arrival_round": ROUNDS + 1})
    values = {inp.free.t.get_id(): 512, inp.evictable.t.get_id(): 256}
    values[inp.release_rounds.t.get_id()] = 0
    for q, r in zip(inp.requests, given["requests"], strict=True):
        values |= {
            q.prompt.t.get_id(): r["prompt_tokens"],
            q.device.t.get_id(): 0,
            q.unpinned.t.get_id(): r.get("device_prefix_tokens", 0),
            q.host.t.get_id(): r.get("host_prefix_tokens", 0),
            q.arrival.t.get_id(): r.get("arrival_round", 1),
        }

    def read(x):
        term = x if isinstance(x, z3.ExprRef) else x.t
        return False if term.eq(inp.release_never) else values[term.get_id()]

    exported = scenario_of(u, read, "no-oom", 1, combo)
    b = exported["requests"][1]
    assert (b["device_prefix_tokens"], b.get("device_prefix_pinned")) == (128, None)
    assert exported["pool"]["evictable_tokens"] == 256
    exported["requests"] = exported["requests"][:2]
    assert concrete_rounds(exported, combo, ROUNDS) == concrete_rounds(
        EVICTED_WHILE_WAITING, combo, ROUNDS
    )


#: the model's approximation above: A's 64-token prefix, left old by A's match (its 192-token
#: host run covers the window and a page), is evicted first by the node in round 4, keeping
#: B's; the model refreshed A's whole unit at A's release and evicts B's prefix instead
HOST_RUN_OUTLASTS_THE_WINDOW = {
    "page_size": 64,
    "chunked_prefill_size": 256,
    "max_prefill_tokens": None,
    "pool": {
        "free_tokens": 64,
        "evictable_tokens": 1280,
        "swa_free_tokens": 768,
        "sliding_window": 128,
    },
    "kv_release_rounds": None,
    "requests": [
        {
            "id": "A",
            "prompt_tokens": 961,
            "arrival_round": 1,
            "device_prefix_tokens": 64,
            "host_prefix_tokens": 192,
        },
        {"id": "B", "prompt_tokens": 65, "arrival_round": 1, "device_prefix_tokens": 64},
        {"id": "C", "prompt_tokens": 1, "arrival_round": 1},
    ],
}


def test_the_model_refreshes_a_released_unit_whole(registry) -> None:
    combo = registry.resolve("no-evict/defer/page")
    (concrete, _), (modelled, _) = (
        concrete_rounds(HOST_RUN_OUTLASTS_THE_WINDOW, combo, 4),
        model_rounds(HOST_RUN_OUTLASTS_THE_WINDOW, combo, 4),
    )
    assert concrete[3][0][0] == ("B", "whole", 64, 65, 0)
    assert modelled[3][0][0] == ("B", "whole", 0, 65, 0)
