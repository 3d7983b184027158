"""Seed 001: the in-progress request on a hybrid sliding-window model."""

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
    assert entry.tokens == 100  # alloc_extend then needs 100 + 64 > 100: the seed's OOM
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
    assert paged.tokens == 64  # page alignment alone does not leave the page alloc_extend needs


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
    assert entry.tokens == 500  # bypasses the exhausted SWA budget


def test_swa_oom_is_reported_against_the_swa_pool(registry):
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
    # The sliding-window pool is paged, as SGLang's is: the 100 free tokens are one page, which
    # the first chunk takes whole (64 tokens). Round 2's checkpoint leaves the request's window
    # locked and nothing free; the pre-fix chunking then falls back to the chunk budget and its
    # 436-token chunk cannot be allocated in the sliding-window pool.
    assert result.oom is not None and result.oom.pool == "swa" and result.oom.round == 2
    assert result.oom.tokens == 436
    for fixed in ("swa-reserve", "sglang"):  # seed 001's fix, and SGLang 0.5.23 which has it
        run = Scheduler(build_node(sc), registry.resolve(f"chunking={fixed}")).run()
        assert run.oom is None, fixed


def test_sglang_0_5_23_resume_leaves_a_page_and_defers(registry):
    """SGLang 0.5.23's resume under hybrid SWA is seed 001's fix: capped at
    ``rem_swa_tokens - page_size`` and deferred when that is not positive."""
    common = {"page": 64, "chunk_budget": 2048, "left": 500, "rem_total": 1 << 20}
    capped, _ = resume(registry, rem_swa=100, chunking="sglang", **common)
    assert capped.tokens == 36 and capped.kind is EntryKind.RESUMED
    deferred, _ = resume(registry, rem_swa=64, chunking="sglang", **common)
    assert deferred.kind is EntryKind.DEFERRED
