"""Fault injection: every fault ends in a rolled-back round or one cleanly failed request.

Fatal (the run stops, like the engine): PrefillOutOfMemory, and any unknown exception from the
allocator. Either way the node is first rolled back to exactly its state before the round.
Recoverable (the request fails with a reason, the others are served in the same round): a
policy that raises or returns nonsense, a failed host-tier copy.
"""

from __future__ import annotations

import json
import re

import pytest
import torch

from policykit.config import EngineConfig
from policykit.errors import PlanError, PrefillOutOfMemory
from policykit.node import PrefillNode
from policykit.plan import Entry, EntryKind, Plan
from policykit.plugin_manager import make_plugin_manager
from policykit.pool import KVLayout
from policykit.request import Request, State
from policykit.scheduler import Scheduler

from .faults import BrokenHostCopyNode, FlakyPool, registry_with_misbehaving
from .node_invariants import check_node, fingerprint

PAGE = 16
REGISTRY = registry_with_misbehaving()
SAFE = "admission=reserve-tail,chunking=defer,alignment=page"
LAYOUT = KVLayout(layers=2, kv_heads=1, head_dim=4, dtype=torch.float32)


def make(
    prompts: dict[str, int],
    *,
    pages: int = 64,
    chunk: int = 4096,
    combo: str | None = None,
    node_cls: type[PrefillNode] = PrefillNode,
    layout: KVLayout | None = None,
    **node_kwargs,
) -> tuple[PrefillNode, FlakyPool, Scheduler]:
    """A node whose requests all arrived (round 1) with distinct tokens."""
    pool = FlakyPool(pages * PAGE, PAGE, layout=layout)
    config = EngineConfig(page_size=PAGE, chunked_prefill_size=chunk)
    node = node_cls(config, pool, **node_kwargs)
    for i, (rid, n) in enumerate(prompts.items()):
        node.add(Request(rid, tuple(range(i * 100_000, i * 100_000 + n)), arrival_round=1))
    node.arrive(1)
    return node, pool, Scheduler(node, REGISTRY.resolve(SAFE, combo))


def cache_filler(node: PrefillNode, tokens: int) -> None:
    """Evictable cached prefix nobody uses (commits must evict it to pay)."""
    filler = tuple(range(9_000_000, 9_000_000 + tokens))
    node.cache.insert(filler, node.pool.alloc(tokens // PAGE))


def states(node: PrefillNode) -> dict[str, State]:
    return {q.id: q.state for q in node.requests.values()}


# --- the allocator fails --------------------------------------------------------------------
@pytest.mark.parametrize("call", [1, 2, 3])
def test_allocator_out_of_memory_mid_batch_rolls_the_round_back(call):
    node, pool, sched = make({"a": 100, "b": 200, "c": 300}, pages=48)
    cache_filler(node, 20 * PAGE)  # free 28 pages, the batch needs 39: it must evict 11
    before = fingerprint(node)
    pool.fail_on(call)
    with pytest.raises(PrefillOutOfMemory) as err:
        sched.step()
    assert err.value.request == ["a", "b", "c"][call - 1]
    assert fingerprint(node) == before, "the failed commit changed the node"
    check_node(node)
    # the rolled-back node is usable: the same round goes through once the fault is gone
    record = sched.step()
    assert [e.request_id for e in record.plan.batch] == ["a", "b", "c"]
    assert states(node) == {"a": State.HELD, "b": State.HELD, "c": State.HELD}
    check_node(node)


def test_allocator_out_of_memory_at_load_back_rolls_back_the_locks_taken_before_it():
    node, pool, sched = make({"a": 10 * PAGE, "b": 300, "c": 500}, pages=128)
    # b reuses a cached prefix (locked first), c loads 20 pages back from the host tier
    b, c = node.requests["b"], node.requests["c"]
    node.cache.insert(b.tokens[: 8 * PAGE], pool.alloc(8))
    node.host.put(c.tokens[: 20 * PAGE], 0)
    before = fingerprint(node)
    pool.fail_on(1)  # the round's first allocation is c's load-back, after b's lock
    with pytest.raises(PrefillOutOfMemory) as err:
        sched.step()
    assert (err.value.request, err.value.tokens) == ("c", 320)
    assert fingerprint(node) == before, "b's lock or c's pages survived the failed commit"
    check_node(node)
    record = sched.step()
    assert [(e.request_id, e.cached, e.load_back) for e in record.plan.batch] == [
        ("a", 0, 0),
        ("b", 128, 0),
        ("c", 0, 320),
    ]
    check_node(node)


def test_a_failing_load_back_allocation_is_the_first_allocation_of_the_round():
    node, pool, sched = make({"c": 500})
    node.host.put(node.requests["c"].tokens[:320], 0)
    before = fingerprint(node)
    pool.fail_on(1)
    with pytest.raises(PrefillOutOfMemory) as err:
        sched.step()
    assert err.value.request == "c" and err.value.tokens == 320
    assert fingerprint(node) == before
    check_node(node)


def test_an_unknown_allocator_error_rolls_back_and_propagates():
    node, pool, sched = make({"a": 100, "b": 200})
    before = fingerprint(node)
    pool.fail_on(2, RuntimeError("CUDA error: an illegal memory access was encountered"))
    with pytest.raises(RuntimeError, match="illegal memory access"):
        sched.step()
    assert fingerprint(node) == before
    check_node(node)


def test_scheduler_run_reports_an_out_of_memory_and_stops():
    node, pool, sched = make({"a": 100, "b": 200})
    pool.fail_on(1)
    result = sched.run()
    assert result.stopped_by == "oom" and result.oom is not None
    assert result.oom.round == 1 and result.oom.request == "a"
    assert result.pending == ["a", "b"]
    check_node(node)


# --- the host-tier copy fails ---------------------------------------------------------------
def test_a_failed_host_copy_fails_that_request_and_serves_the_others():
    tokens = {"x": 400, "y": 400, "z": 64}
    node, pool, sched = make(tokens, node_cls=BrokenHostCopyNode, layout=LAYOUT)
    x, y = node.requests["x"], node.requests["y"]
    for req in (x, y):
        kv = [(torch.randn(320, 1, 4), torch.randn(320, 1, 4)) for _ in range(LAYOUT.layers)]
        node.host.put(req.tokens[:320], 0, kv)
    node.broken = {x.tokens[:320]}
    record = sched.step()
    assert record.failed == ["x"]
    assert x.state is State.FAILED
    assert (
        "Copying the 320-token host-tier prefix of 'x'" in x.reason
        and "host buffer unreadable" in x.reason
    )
    assert [(e.request_id, e.load_back) for e in record.plan.batch] == [("y", 320), ("z", 0)]
    assert y.state is State.HELD and node.requests["z"].state is State.HELD
    # y's copy landed in its own slots
    slots = pool.slots(y.pages, 0, 320)
    host_k = node.host.lookup(y.tokens, 0).kv[0][0]
    assert torch.equal(pool.k[0][slots], host_k)
    check_node(node)
    assert sched.run().failed == {"x": x.reason}


# --- policies misbehave ---------------------------------------------------------------------


@pytest.mark.parametrize(
    ("combo", "message"),
    [
        ("admission=raising", "The admission policy 'raising' {src} raised ZeroDivisionError"),
        ("admission=non-bool", "The admission policy 'non-bool' {src} answered 'yes'"),
        (
            "chunking=bad:negative",
            "The chunking policy 'bad:negative' {src} returned the chunk "
            "length -16 for request 'bad' with 77 tokens left",
        ),
        ("chunking=bad:beyond", "returned the chunk length 78 for request 'bad' with 77"),
        ("chunking=bad:float", "returned the chunk length 77.0"),
        ("chunking=bad:none", "returned the chunk length None"),
        ("chunking=bad:bool", "returned the chunk length True"),
    ],
)
def test_a_policy_misbehaving_on_one_request_fails_it_and_serves_the_others(combo, message):
    node, _pool, sched = make({"a": 64, "bad": 77, "c": 64}, combo=combo)
    record = sched.step()
    bad = node.requests["bad"]
    assert record.failed == ["bad"] and bad.state is State.FAILED
    # the policy, its distribution, its module and the line of the method that answered
    who = r"\(misbehaving-policies 0\.0\.1\), module \S+, \w+\(\) at \S+faults\.py:\d+,"
    assert re.search(re.escape(message).replace(re.escape("{src}"), who), bad.reason), bad.reason
    assert [e.request_id for e in record.plan.batch] == ["a", "c"]
    assert states(node) == {"a": State.HELD, "bad": State.FAILED, "c": State.HELD}
    check_node(node)


def test_a_negative_tail_reservation_fails_the_truncated_request():
    node, _pool, sched = make(
        {"long": 1000, "short": 64}, chunk=256, combo="admission=negative-tail"
    )
    record = sched.step()
    long_ = node.requests["long"]
    assert record.failed == ["long"]
    assert "The admission policy 'negative-tail' (misbehaving-policies 0.0.1)" in long_.reason
    assert "tail_reserve() at " in long_.reason and "reserved -744" in long_.reason
    assert [e.request_id for e in record.plan.batch] == ["short"]
    check_node(node)


def test_an_alignment_policy_moving_the_end_backwards_fails_the_request():
    node, _pool, sched = make({"long": 1000, "short": 64}, chunk=256, combo="alignment=backwards")
    record = sched.step()
    assert record.failed == ["long"]
    assert (
        "moved the end of the chunk [0, 256) of request 'long' to -1"
        in node.requests["long"].reason
    )
    assert node.requests["short"].state is State.HELD
    check_node(node)


def test_a_policy_failing_on_resume_frees_the_in_progress_requests_kv():
    node, pool, sched = make({"long": 1000, "other": 64}, chunk=256)
    sched.step()  # long is truncated and holds 16 pages; other waits (compute budget)
    long_ = node.requests["long"]
    assert long_.state is State.CHUNKED and long_.own_pages.numel() == 16
    sched.use(REGISTRY.resolve(SAFE, "chunking=bad:negative"))
    record = sched.step()
    assert record.failed == ["long"] and long_.state is State.FAILED
    assert "returned the chunk length -16 for request 'long' with 744 tokens left" in long_.reason
    assert long_.own_pages.numel() == 0
    assert [e.request_id for e in record.plan.batch] == ["other"]
    assert pool.free_pages == 64 - 4
    check_node(node)


def test_a_policy_broken_for_every_request_fails_them_all_and_the_run_ends():
    node, pool, sched = make({"a": 77, "b": 77}, combo="admission=raising")
    result = sched.run()
    assert result.stopped_by == "idle" and result.oom is None
    assert sorted(result.failed) == ["a", "b"]
    assert pool.free_pages == pool.num_pages
    check_node(node)


# --- a plan that does not match the node (a replay, another rank) ----------------------------
def _plan(*entries: Entry) -> Plan:
    return Plan(round=1, entries=entries)


@pytest.mark.parametrize(
    ("entries", "message"),
    [
        ((Entry("ghost", 0, 64, EntryKind.WHOLE),), "no such request is on this node"),
        (
            (Entry("a", 0, 64, EntryKind.WHOLE), Entry("a", 0, 64, EntryKind.WHOLE)),
            "twice",
        ),
        ((Entry("a", 0, 32, EntryKind.WHOLE),), "as a whole chunk of its 64-token prompt"),
        ((Entry("a", 16, 64, EntryKind.WHOLE),), "it is waiting with 0 tokens"),
        ((Entry("a", 0, 64, EntryKind.FINAL),), "as a final chunk, but it is waiting"),
        ((Entry("a", 0, 80, EntryKind.WHOLE),), "of its 64-token prompt"),
        ((Entry("a", 0, -5, EntryKind.TRUNCATED),), "of its 64-token prompt"),
        (
            (Entry("a", 0, 16, EntryKind.TRUNCATED), Entry("b", 0, 16, EntryKind.TRUNCATED)),
            "leaves 2 requests in progress",
        ),
        ((Entry("a", 16, 64, EntryKind.WHOLE, cached=16),), "16-token cached prefix"),
        ((Entry("a", 16, 64, EntryKind.WHOLE, load_back=16),), "the host has fewer"),
    ],
)
def test_commit_refuses_a_plan_that_does_not_match_the_node(entries, message):
    node, _pool, _sched = make({"a": 64, "b": 64})
    before = fingerprint(node)
    with pytest.raises(PlanError, match=message):
        node.commit(_plan(*entries))
    assert fingerprint(node) == before
    check_node(node)


def test_commit_refuses_a_plan_for_a_finished_request_and_one_leaving_out_the_chunked():
    node, _pool, sched = make({"a": 64, "long": 1000}, chunk=256, pages=128)
    sched.step()
    sched.step()
    assert node.requests["a"].state is State.HELD and node.chunked is node.requests["long"]
    before = fingerprint(node)
    with pytest.raises(PlanError, match=r"'a' .* it is held"):
        node.commit(
            _plan(Entry("a", 0, 64, EntryKind.WHOLE), Entry("long", 512, 512, EntryKind.DEFERRED))
        )
    with pytest.raises(PlanError, match="leaves out the in-progress request 'long'"):
        node.commit(_plan())
    assert fingerprint(node) == before


# --- the engine's own OOM -------------------------------------------------------------------
def test_the_seed_incident_oom_leaves_the_node_as_before_its_round(run_bundled):
    node, result, before = run_bundled(
        "seed-incident-1keim", "admission=sglang,chunking=sglang,alignment=checkpoint:256"
    )
    assert result.oom is not None and result.oom.round == 4
    assert fingerprint(node) == before
    keim = node.requests["1keim"]
    assert keim.state is State.CHUNKED and keim.seq_len == 91968
    check_node(node)


# --- what the user sees ---------------------------------------------------------------------
def test_simulate_names_a_failed_request_and_the_policy_that_failed_it(monkeypatch):
    from click.testing import CliRunner

    from policykit.cli import main, simulate

    monkeypatch.setattr(
        simulate, "load_registry", lambda: (make_plugin_manager(entry_points=False), REGISTRY)
    )
    args = ["simulate", "seed-abc", "--combo", "chunking=bad:negative"]
    text = CliRunner().invoke(main, args)
    # B was admitted (truncated) before the policy failed it: it can never complete, but the
    # policy fault is the news (exit 4 wins over 3: a broken plugin must not pass CI)
    assert text.exit_code == 4, text.output
    flat = " ".join(text.output.split())
    assert "failed: B: The chunking policy 'bad:negative' (misbehaving-policies 0.0.1)" in flat
    assert "not checkable" in text.stderr  # and the checker would refuse that policy
    out = json.loads(CliRunner().invoke(main, [*args, "--json"]).stdout)
    assert [f["id"] for f in out["failed"]] == ["B"]
    assert (out["never_completes"]["request"], out["never_completes"]["cause"]) == (
        "B",
        "policy-error",
    )
    assert "B" not in out["completed"] and "B" not in out["pending"]
