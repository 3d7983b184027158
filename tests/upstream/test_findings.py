"""Findings of ``policykit check`` on the upstream-faithful combo, confirmed on upstream's code.

``no-starvation`` is violated for ``sglang/sglang/none`` with SGLang 0.5.23's ``fcfs`` queue.
The counterexample the checker exports is driven through upstream's real ``PrefillAdder``
(``policykit.conformance.sglang``): upstream never schedules the request policykit says starves,
and the two sides agree round by round.

With hybrid SWA, ``admitted-completes`` is violated on a sliding-window pool smaller than the
window: upstream admits a request that pool can never finish, computes two chunks of it and then
defers it for good. SGLang 0.5.23 refuses to start with such a pool (``validate_swa_pool_size``).
On the pools it starts with, one request alone cannot get stuck so, and the request stuck behind
a finished one's window waits only for KV that is never released.
"""

from __future__ import annotations

import pytest

from policykit.config import EngineConfig
from policykit.conformance.sglang.compare import UPSTREAM_COMBO, conform, run_policykit
from policykit.conformance.sglang.run import drive
from policykit.scenario import parse_scenario
from policykit.spec.bmc import Bounds
from policykit.spec.checker import CheckOptions, check_combo


def test_the_starvation_counterexample_starves_upstream_too(upstream, registry):
    combo = registry.resolve(UPSTREAM_COMBO)
    options = CheckOptions(properties=("no-starvation",))
    (verdict,) = check_combo(combo, EngineConfig(64, 4096), options)
    assert verdict.verdict == "violated"
    cx = verdict.counterexample
    starving = cx.failure.request
    scenario = parse_scenario(cx.scenario, source="the counterexample")
    theirs = drive(scenario, max_rounds=20)
    scheduled = {e.request_id for r in theirs.rounds for e in r.plan.entries}
    assert starving not in scheduled and starving in theirs.pending
    assert conform(scenario).identical


def test_a_request_the_sliding_window_pool_can_never_finish_is_admitted_upstream_too(
    upstream, registry
):
    """Window 512, page 64: ``check`` finds (with one request, in round 3) a request that
    SGLang 0.5.23's never-fits escape hatch (``swa_chunk_cap``) admits into a sliding-window pool
    smaller than its window; two chunks later the pool cannot hold its window plus a page, and
    the resume is deferred with nothing left that could free memory. Upstream, driven on the
    exported scenario, does the same: the request computed a part, never completes, and the run
    stops idle with it pending, a state no later round changes."""
    combo = registry.resolve(UPSTREAM_COMBO)
    options = CheckOptions(requests=1, properties=("admitted-completes",))
    (verdict,) = check_combo(combo, EngineConfig(64, 4096, 512), options)
    assert (verdict.verdict, verdict.bound) == ("violated", "round 3")
    cx = verdict.counterexample
    assert cx.failure.detail == "stuck"
    stuck = cx.failure.request
    scenario = parse_scenario(cx.scenario, source="the counterexample")
    assert scenario.swa_free_tokens < scenario.config.sliding_window
    theirs = drive(scenario, max_rounds=50)
    computed = [
        e
        for r in theirs.rounds
        for e in r.plan.entries
        if e.request_id == stuck and e.end > e.start
    ]
    assert len(computed) == 2 and theirs.stopped_by == "idle"
    assert stuck in theirs.pending and stuck not in theirs.completed
    assert conform(scenario).identical


@pytest.mark.parametrize(("swa_tokens", "starts"), [(576, False), (577, True)])
def test_sglang_refuses_to_start_with_a_pool_at_or_under_window_plus_page(
    upstream, swa_tokens, starts
):
    """Why the finding above is not an upstream bug: 0.5.23 validates the pool at startup."""
    from sglang.srt.model_executor.pool_configurator import MemoryPoolConfigurator

    if starts:
        MemoryPoolConfigurator.validate_swa_pool_size(swa_tokens, 512, 64)
    else:
        with pytest.raises(ValueError, match="cannot hold even one request"):
            MemoryPoolConfigurator.validate_swa_pool_size(swa_tokens, 512, 64)


def test_on_a_pool_sglang_starts_with_a_window_lock_leaves_one_request_stuck(upstream, registry):
    """The same search on sliding-window pools above ``window + page``, now that the node and
    the model keep sliding-window KV in the tree as SGLang 0.5.23 does: a cached prefix's
    window lock holds sliding-window KV (a pinned one's for good), and one request alone can
    wait forever on a pool SGLang starts with. SGLang's own scheduler and storage do the same with
    the counterexample (identical runs, the request never completes)."""
    combo = registry.resolve(UPSTREAM_COMBO)
    options = CheckOptions(
        rounds=3,
        requests=1,
        properties=("admitted-completes",),
        bounds=Bounds(min_swa_pool_tokens=512 + 64 + 1),
    )
    (verdict,) = check_combo(combo, EngineConfig(64, 4096, 512), options)
    assert verdict.verdict == "violated" and verdict.bounds["min_swa_pool_tokens"] == 577
    assert verdict.counterexample.failure.detail == "stuck"
    scenario = parse_scenario(verdict.counterexample.scenario, source="test")
    assert conform(scenario, storage=True).identical
    assert drive(scenario, max_rounds=20).completed == []


def test_a_pinned_window_starves_a_request_upstream_too(upstream, registry):
    """``no-starvation`` on the same pools: a pinned prefix's window keeps a request out on a
    drained node where an idle one would take it; SGLang refuses it every round too."""
    combo = registry.resolve(UPSTREAM_COMBO)
    options = CheckOptions(
        rounds=3,
        requests=1,
        properties=("no-starvation",),
        bounds=Bounds(min_swa_pool_tokens=512 + 64 + 1),
    )
    (verdict,) = check_combo(combo, EngineConfig(64, 4096, 512), options)
    assert verdict.verdict == "violated"
    scenario = parse_scenario(verdict.counterexample.scenario, source="test")
    assert conform(scenario, storage=True).identical
    theirs = drive(scenario, max_rounds=20)
    assert not [e for r in theirs.rounds for e in r.plan.entries] and theirs.pending == ["A"]


def test_a_host_hit_behind_a_window_lock_waits_for_good_upstream_too(upstream):
    """Window 512, a pool SGLang starts with: A's unpinned 64-token device prefix keeps its
    window locked when A is matched, and the 512-token host hit behind it charges its last
    window (``swa_host_hit_length``): together more than the 640-token sliding-window pool
    leaves for A's chunk, so A waits for good, upstream too. Evicting the prefix would not help:
    with all 576 tokens on the host and nothing on the device, SGLang refuses A on an idle node
    as well (docs/findings/sglang-swa-host-hit.md). policykit's skipping queue
    does not see a wait on a window lock (a known gap, docs/conformance.md), so A is not
    rejected either."""
    scenario = parse_scenario(NEVER_FITS_HOST_HIT, source="test")
    theirs = drive(scenario, max_rounds=20)
    assert not [e for r in theirs.rounds for e in r.plan.entries] and theirs.pending == ["A"]
    assert conform(scenario, storage=True).identical
    skip = run_policykit(scenario, UPSTREAM_COMBO.replace("queue=fcfs", "queue=fcfs-skip"))
    assert not skip.rejected and not skip.completed


NEVER_FITS_HOST_HIT = {
    "name": "swa-host-hit-never-fits",
    "page_size": 64,
    "chunked_prefill_size": 4096,
    "pool": {
        "free_tokens": 1024,
        "evictable_tokens": 64,
        "swa_free_tokens": 640,
        "sliding_window": 512,
    },
    "requests": [
        {"id": "A", "prompt_tokens": 640, "device_prefix_tokens": 64, "host_prefix_tokens": 512}
    ],
}


def _held_window(release: int | None):
    """A 1088-token sliding-window pool (window 512): A (512 tokens) finishes in round 1 and
    holds its window until its KV is released; B (2048, round 2) enters by the never-fits
    escape hatch with 448 tokens, takes 64 more, and then needs A's window back."""
    return parse_scenario(
        {
            "name": "swa-held-window",
            "page_size": 64,
            "chunked_prefill_size": 4096,
            "pool": {
                "free_tokens": 8192,
                "evictable_tokens": 0,
                "swa_free_tokens": 1088,
                "sliding_window": 512,
            },
            "kv_release_rounds": release,
            "requests": [
                {"id": "A", "prompt_tokens": 512},
                {"id": "B", "prompt_tokens": 2048, "arrival_round": 2},
            ],
        },
        source="test",
    )


@pytest.mark.parametrize("release", [None, 2])
def test_behind_a_held_window_upstream_waits_for_its_release(upstream, release):
    theirs = drive(_held_window(release), max_rounds=50)
    b = [(e.start, e.end) for r in theirs.rounds for e in r.plan.entries if e.request_id == "B"]
    if release is None:  # A's KV never comes back: B computed 512 tokens and waits for good
        assert [x for x in b if x[1] > x[0]] == [(0, 448), (448, 512)]
        assert "B" in theirs.pending and theirs.stopped_by == "idle"
    else:
        assert sorted(theirs.completed) == ["A", "B"]
    assert conform(_held_window(release)).identical
