"""Liveness: nothing blocks the queue forever, deferred work resumes, waiting is reported.

Also the regressions the state machine found, each pinned as the smallest run that showed it.
"""

from __future__ import annotations

import json

import pytest
from click.testing import CliRunner

from policykit.cli import main
from policykit.config import EngineConfig
from policykit.node import PrefillNode
from policykit.plugin_manager import make_plugin_manager
from policykit.pool import TokenPool
from policykit.registry import PolicyRegistry
from policykit.request import Request, State
from policykit.scheduler import Scheduler

from .node_invariants import check_node

REGISTRY = PolicyRegistry.from_plugins(make_plugin_manager(entry_points=False))
PAGE = 16


def node_with(pages: int, chunk: int = 4096, page: int = PAGE, **config) -> PrefillNode:
    cfg = EngineConfig(page_size=page, chunked_prefill_size=chunk, **config)
    return PrefillNode(cfg, TokenPool(pages * page, page))


def add(node: PrefillNode, rid: str, tokens, arrival: int = 0) -> Request:
    req = Request(rid, tuple(tokens), arrival_round=arrival)
    node.add(req)
    return req


# --- a request that can never fit ----------------------------------------------------------
def test_a_prompt_larger_than_the_pool_is_rejected_on_arrival_and_does_not_block():
    node = node_with(pages=8)
    big = add(node, "big", range(8 * PAGE + 1))
    add(node, "small", range(1000, 1100))
    result = Scheduler(node, REGISTRY.resolve(None)).run()
    assert big.state is State.REJECTED
    assert result.rejected == {"big": "its 129-token prompt can never fit the 128-token KV pool"}
    assert result.completed == ["small"]
    check_node(node)


@pytest.mark.parametrize(
    ("combo", "prompt", "why"),
    [
        # sglang: remaining + first token + a page < what may be promised (strictly)
        ("admission=sglang", 128 - 17, "The admission policy 'sglang' (built-in) refuses"),
        # no-evict reserves the paged prompt + first token + a page
        ("admission=no-evict", 128 - 16, "The admission policy 'no-evict' (built-in) refuses"),
    ],
)
def test_a_prompt_the_admission_policy_refuses_even_on_an_idle_node_is_rejected(combo, prompt, why):
    """It fits the pool, so arrival lets it in, but the policy will never admit it: the queue
    behind it must not wait forever (vLLM #39734) with policykit's skipping queue."""
    node = node_with(pages=8)
    add(node, "head", range(prompt))
    add(node, "next", range(1000, 1032))
    result = Scheduler(node, REGISTRY.resolve(f"{combo},queue=fcfs-skip")).run()
    assert list(result.rejected) == ["head"]
    assert result.rejected["head"].startswith(why)
    assert "even on an idle node (128 tokens could ever be free)" in result.rejected["head"]
    assert result.completed == ["next"]
    first = result.rounds[0].plan
    assert [(r.request_id, r.verdict) for r in first.rejected] == [("head", "NEVER")]
    check_node(node)


def test_one_token_less_is_admitted_not_rejected():
    node = node_with(pages=8)
    add(node, "head", range(128 - 18))
    result = Scheduler(node, REGISTRY.resolve("admission=sglang")).run()
    assert result.completed == ["head"] and not result.rejected


def test_pinned_prefixes_count_as_memory_that_never_comes_back():
    node = node_with(pages=8)
    pinned = tuple(range(5000, 5000 + 4 * PAGE))
    node.cache.insert(pinned, node.pool.alloc(4))
    node.cache.pin(node.cache.match(pinned)[1])
    # 80 tokens fit the 128-token pool, not the 64 tokens the pin leaves
    add(node, "blocked", range(80))
    # a request that starts with the pinned prefix gets it for free: 64 + 32 tokens
    add(node, "reuses", (*pinned, *range(9000, 9032)))
    result = Scheduler(node, REGISTRY.resolve("admission=sglang,queue=fcfs-skip")).run()
    assert "(64 tokens could ever be free)" in result.rejected["blocked"]
    assert result.completed == ["reuses"]
    check_node(node)


def test_a_pinned_prefix_credit_is_counted_in_the_idle_check():
    node = node_with(pages=8)
    pinned = tuple(range(5000, 5000 + 4 * PAGE))
    node.cache.insert(pinned, node.pool.alloc(4))
    node.cache.pin(node.cache.match(pinned)[1])
    req = add(node, "r", (*pinned, *range(9000, 9040)))
    sched = Scheduler(node, REGISTRY.resolve("admission=sglang"))
    reason = sched.planner.never_fits(req)
    assert reason is None
    more = add(node, "more", (*pinned, *range(9100, 9100 + 48)))
    reason = sched.planner.never_fits(more)
    assert reason is not None and "64 of its prompt cached and pinned" in reason


# --- deferred work resumes -----------------------------------------------------------------
def test_a_deferred_chunked_request_resumes_once_memory_is_released():
    """Seed 000's shape: the truncated request leaves a compute gap, a load-back takes the
    memory through it; under ``defer`` the truncated request waits instead of OOMing, and
    resumes the round the load-back's KV is released."""
    node = node_with(pages=16, chunk=96, kv_release_rounds=3)
    add(node, "long", range(200))
    hog = add(node, "hog", range(1000, 1150))
    node.host.put(hog.tokens[:144], 0)
    combo = "admission=sglang,chunking=defer,alignment=checkpoint:64"
    result = Scheduler(node, REGISTRY.resolve(combo)).run()
    timeline = [
        (r.plan.round, e.kind.value, e.tokens)
        for r in result.rounds
        for e in r.plan.entries
        if e.request_id == "long"
    ]
    released = next(r.plan.round for r in result.rounds if "hog" in r.released)
    assert released == 4
    assert timeline[:4] == [
        (1, "truncated", 64),
        (2, "resumed", 32),
        (3, "deferred", 0),
        (4, "resumed", 96),
    ]
    assert timeline[-1][1] == "final"
    assert result.completed == ["long", "hog"] and result.oom is None
    check_node(node)


# --- starvation is reported ----------------------------------------------------------------
def test_starvation_names_requests_that_waited_too_long():
    node = node_with(pages=16, chunk=64, kv_release_rounds=20)
    add(node, "first", range(200))
    add(node, "second", range(1000, 1200))
    result = Scheduler(node, REGISTRY.resolve(None), starvation_rounds=3).run()
    assert result.completed == ["first", "second"]
    second = node.requests["second"]
    assert result.starved == {"second": second.first_scheduled_round - 1}
    assert result.starved["second"] > 3 and "first" not in result.starved


def test_simulate_fails_on_starvation_with_a_configurable_threshold():
    """A starved request fails the run with its own exit code (5), listed in the text and in
    the JSON beside the bound; under the bound the run passes (issue 33)."""
    runner = CliRunner()
    strict = runner.invoke(main, ["simulate", "seed-abc", "--starvation-rounds", "0", "--json"])
    assert strict.exit_code == 5, strict.output
    doc = json.loads(strict.stdout)
    assert doc["schema"] == "policykit.simulate/1" and doc["created"]
    assert doc["starved"] == [{"id": "C", "waited_rounds": 3}]
    assert doc["starvation_rounds"] == 0
    lax = runner.invoke(main, ["simulate", "seed-abc", "--starvation-rounds", "3", "--json"])
    assert lax.exit_code == 0, lax.output
    assert json.loads(lax.stdout)["starved"] == []
    text = runner.invoke(main, ["simulate", "seed-abc", "--starvation-rounds", "0"])
    assert text.exit_code == 5
    assert "starved:   C waited 3 rounds" in text.output
    assert "Starved (exit 5): C (3 rounds) waited more than 0 rounds" in text.output
    bad = runner.invoke(main, ["simulate", "seed-abc", "--starvation-rounds", "-1"])
    assert bad.exit_code == 2 and "Traceback" not in bad.output


# --- regressions found by the state machine ------------------------------------------------
def test_regression_a_later_arrival_added_first_does_not_hold_back_an_earlier_one():
    """``arrive`` looked only at the head of the future queue, which was in insertion order."""
    node = node_with(pages=8, page=1)
    late = add(node, "late", [1], arrival=2)
    early = add(node, "early", [2], arrival=1)
    node.arrive(1)
    assert early.state is State.WAITING and late.state is State.FUTURE
    check_node(node)


def test_regression_a_request_is_not_blocked_by_its_own_cached_prefix():
    """no-evict charges the whole prompt *and* the planner lowered the baseline by the prefix
    it locked: the prefix was paid twice, the request never fit, and an idle node never evicts
    that prefix. It now computes the prompt afresh when reusing the prefix is what blocks it."""
    node = node_with(pages=5, page=1)
    sched = Scheduler(node, REGISTRY.resolve("admission=no-evict"))
    add(node, "donor", [0, 1])
    add(node, "pinner", [10000, 2])
    for _ in range(2):  # one at a time: each needs 2 + a first token + a page of 5
        sched.step()
        for req in list(node.held):
            node.release(req)
    node.cache.pin(node.cache.match([10000])[1])  # 1 token pinned: 4 can ever be free
    reuser = add(node, "reuser", [0, 3], arrival=sched.round_no + 1)
    record = sched.step()
    assert [(e.request_id, e.cached) for e in record.plan.batch] == [("reuser", 0)]
    assert reuser.state is State.HELD
    check_node(node)
    sched.step()
    node.release(reuser)  # the duplicate prefix page goes back to the free list
    check_node(node)


def test_regression_an_in_progress_request_deferred_forever_is_failed():
    """A sliding-window pool too small for window + chunk + page: the defer policy waited for
    memory that could never come back, holding its KV, with the queue behind it. (``no-evict``
    admission, which ignores the sliding-window budget: SGLang 0.5.23's ``sglang`` admission
    refuses this request up front, its window-capped estimate never fitting the pool.)"""
    cfg = EngineConfig(page_size=1, chunked_prefill_size=1, sliding_window=1)
    node = PrefillNode(cfg, TokenPool(13, 1), swa_pool=TokenPool(2, 1, name="swa"))
    stuck = add(node, "stuck", [0, 1])
    add(node, "next", [7], arrival=3)
    result = Scheduler(node, REGISTRY.resolve("admission=no-evict,chunking=defer")).run()
    assert stuck.state is State.FAILED
    assert result.failed["stuck"].startswith(
        "The chunking policy 'defer' (built-in) deferred it on a node with nothing else"
    )
    assert result.completed == ["next"]
    check_node(node)
