"""The hybrid-SWA resume (docs/incidents.md#swa-resume): the in-progress request on a hybrid
sliding-window model, the planner's decisions before and after the fix, and what the node's
paged sliding-window pool (SGLang 0.5.23's) makes of them."""

from __future__ import annotations

from policykit.ledger import Ledger
from policykit.plan import EntryKind
from policykit.planner import Planner
from policykit.scenario import build_node, parse_scenario


def resume(registry, *, page, chunk_budget, left, rem_total, rem_swa, chunking, align="none"):
    """Plan one round for an in-progress request with ``left`` tokens to go."""
    computed = 4 * page
    hybrid = rem_swa is not None
    pool = {"free_tokens": 1024 * page, "evictable_tokens": 0}
    if hybrid:
        pool |= {"swa_free_tokens": 4096, "sliding_window": 4096}
    sc = parse_scenario(
        {
            "page_size": page,
            "chunked_prefill_size": chunk_budget,
            "pool": pool,
            "requests": [
                {
                    "id": "r",
                    "prompt_tokens": computed + left,
                    "computed_tokens": computed,
                    "chunked": True,
                }
            ],
        }
    )
    node = build_node(sc)
    ledger = Ledger(
        page_size=page, baseline=rem_total, rem_chunk_tokens=chunk_budget, swa_baseline=rem_swa
    )
    combo = registry.resolve(f"chunking={chunking},alignment={align}", config=sc.config)
    (entry,) = Planner(node, combo).plan(1, ledger).entries
    return entry, node.requests["r"]


def test_swa_reserve_caps_the_chunk_one_page_below_the_swa_budget(registry):
    for align in ("none", "page"):  # 36 tokens: less than a page, so page alignment keeps it
        entry, _ = resume(
            registry,
            page=64,
            chunk_budget=2048,
            left=500,
            rem_total=1 << 20,
            rem_swa=100,
            chunking="swa-reserve",
            align=align,
        )
        assert entry.tokens == 36 and entry.kind is EntryKind.RESUMED


def test_swa_reserve_defers_when_the_swa_budget_is_one_page(registry):
    entry, req = resume(
        registry,
        page=64,
        chunk_budget=2048,
        left=500,
        rem_total=1 << 20,
        rem_swa=64,
        chunking="swa-reserve",
    )
    assert entry.kind is EntryKind.DEFERRED and entry.tokens == 0
    assert req.remaining == 500  # untouched


def test_swa_reserve_without_hybrid_swa_runs_the_whole_rest(registry):
    entry, _ = resume(
        registry,
        page=16,
        chunk_budget=500,
        left=200,
        rem_total=300,
        rem_swa=None,
        chunking="swa-reserve",
    )
    assert entry.tokens == 200 and entry.kind is EntryKind.FINAL


def test_pre_fix_chunking_hands_out_the_whole_swa_budget(registry):
    entry, _ = resume(
        registry,
        page=64,
        chunk_budget=2048,
        left=500,
        rem_total=1 << 20,
        rem_swa=100,
        chunking="sglang-pre-swa-fix",
    )
    # The incident's first reason: the whole budget is handed out, and "alloc_extend needs
    # extend + page_size". That is the demand eviction is sized by; the allocation itself takes
    # the chunk's pages, so on a paged pool whose budget is whole pages this alone fits.
    assert entry.tokens == 100
    paged, _ = resume(
        registry,
        page=64,
        chunk_budget=2048,
        left=500,
        rem_total=1 << 20,
        rem_swa=100,
        chunking="sglang-pre-swa-fix",
        align="page",
    )
    assert paged.tokens == 64  # page alignment floors the chunk, but keeps no page in reserve


def test_pre_fix_chunking_falls_back_to_the_chunk_budget(registry):
    entry, _ = resume(
        registry,
        page=64,
        chunk_budget=2048,
        left=500,
        rem_total=1 << 20,
        rem_swa=0,
        chunking="sglang-pre-swa-fix",
    )
    assert entry.tokens == 500  # the fallback to the chunk budget bypasses the spent SWA budget


def test_swa_oom_is_reported_against_the_swa_pool(registry):
    """On a paged sliding-window pool the code before the fix runs out of memory through its
    fallback to the chunk budget, not by handing out the whole budget; the fixed chunkings do
    not run out of memory, but on a pool that holds one free page beside the request's own
    window they defer it for good (docs/concepts/swa.md, the "Finding")."""
    sc = parse_scenario(
        {
            "page_size": 64,
            "chunked_prefill_size": 2048,
            "pool": {
                "free_tokens": 64 * 64,
                "evictable_tokens": 0,
                "swa_free_tokens": 100,
                "sliding_window": 256,
            },
            "requests": [
                {"id": "r", "prompt_tokens": 756, "computed_tokens": 256, "chunked": True}
            ],
        }
    )
    from policykit.scheduler import Scheduler

    result = Scheduler(build_node(sc), registry.resolve("chunking=sglang-pre-swa-fix")).run()
    # The sliding-window pool is paged, as SGLang's is: the 100 free tokens are one page, and
    # round 1's resume takes it whole (64 tokens), which fits. Round 2's checkpoint leaves the
    # request's window locked (its new 64 tokens do not cover the 256-token window, so the
    # lock still holds the older window too) and nothing free or evictable: the budget is 0,
    # the pre-fix chunking falls back to the chunk budget, which takes the 436-token rest, and
    # those pages are not there.
    assert result.oom is not None and result.oom.pool == "swa" and result.oom.round == 2
    assert result.oom.tokens == 436
    assert result.rounds[0].plan.entries[0].tokens == 64  # the whole budget, allocated
    for fixed in ("swa-reserve", "sglang"):  # the fix, and SGLang 0.5.23, which has it
        run = Scheduler(build_node(sc), registry.resolve(f"chunking={fixed}")).run()
        assert run.oom is None, fixed
        # a budget of one page leaves nothing after the reserved page: deferred in round 1,
        # and no memory can come back (nothing else runs or is held)
        assert run.rounds[0].plan.entries[0].kind is EntryKind.DEFERRED, fixed
        assert "would wait forever" in run.failed["r"], fixed


def test_sglang_0_5_23_resume_leaves_a_page_and_defers(registry):
    """SGLang 0.5.23's resume under hybrid SWA has the fix (docs/incidents.md#swa-resume):
    capped at ``rem_swa_tokens - page_size`` and deferred when that is not positive."""
    common = {"page": 64, "chunk_budget": 2048, "left": 500, "rem_total": 1 << 20}
    capped, _ = resume(registry, rem_swa=100, chunking="sglang", **common)
    assert capped.tokens == 36 and capped.kind is EntryKind.RESUMED
    deferred, _ = resume(registry, rem_swa=64, chunking="sglang", **common)
    assert deferred.kind is EntryKind.DEFERRED
