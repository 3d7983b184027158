"""Seed 000 reproduced number for number: the 1keim incident and the A/B/C example."""

from __future__ import annotations

from policykit.plan import EntryKind

UPSTREAM = "admission=sglang,chunking=sglang,alignment=checkpoint:256"
FIXED = "admission=reserve-tail,chunking=sglang,alignment=checkpoint:256"


def entries(result, round_no):
    return [
        (e.request_id, e.start, e.end, e.kind) for e in result.rounds[round_no - 1].plan.entries
    ]


def mark(result, round_no, rid):
    (m,) = [m for m in result.rounds[round_no - 1].plan.marks if m.request_id == rid]
    return m


def test_incident_upstream_ooms_on_1keims_last_chunk(run_scenario):
    result = run_scenario("seed-incident-1keim", UPSTREAM)
    assert entries(result, 1) == [
        ("v9uj", 0, 13888, EntryKind.WHOLE),
        ("1keim", 86784, 89088, EntryKind.TRUNCATED),  # 2304 tokens, aligned down from 89280
        ("xpkq", 15360, 15545, EntryKind.WHOLE),  # 185 tokens through the 192-token gap
    ]
    assert (mark(result, 1, "1keim").rem_total_tokens, mark(result, 1, "1keim").cur_rem_tokens) == (
        18303,
        18304,
    )
    assert mark(result, 1, "1keim").rem_chunk_tokens == 192
    chunks = [r.plan.entries[0].tokens for r in result.rounds[1:]]
    assert chunks == [2816, 64, 2056]
    assert result.oom is not None
    assert result.oom.round == 4 and result.oom.request == "1keim"
    assert result.oom.tokens == 2056 and result.oom.available == 0
    assert "Try to allocate 2056 tokens" in result.oom.message
    assert "Available full tokens: 0 (full_available_size=0 + full_evictable_size_=0)" in (
        result.oom.message
    )


def test_incident_reserve_tail_rejects_xpkq_and_finishes_1keim(run_scenario):
    result = run_scenario("seed-incident-1keim", FIXED)
    assert mark(result, 1, "1keim").rem_total_tokens == 13310
    assert [(r.request_id, r.verdict) for r in result.rounds[0].plan.rejected] == [
        ("xpkq", "NO_TOKEN")
    ]
    assert entries(result, 2)[0] == ("1keim", 89088, 94024, EntryKind.FINAL)
    assert result.rounds[1].plan.entries[0].tokens == 4936
    assert result.oom is None
    assert result.completed == ["v9uj", "1keim"] and result.pending == ["xpkq"]


def test_abc_checkpoint_admits_c_and_b_ooms(run_scenario):
    result = run_scenario("seed-abc", "admission=sglang,chunking=sglang,alignment=checkpoint:256")
    assert [e[0] for e in entries(result, 1)] == ["A", "B", "C"]
    assert entries(result, 1)[1] == ("B", 0, 2816, EntryKind.TRUNCATED)
    assert result.oom is not None and result.oom.request == "B"


def test_abc_page_alignment_protects_the_tail_implicitly(run_scenario):
    result = run_scenario("seed-abc", "admission=sglang,chunking=sglang,alignment=page")
    assert entries(result, 1) == [
        ("A", 0, 1088, EntryKind.WHOLE),
        ("B", 0, 3008, EntryKind.TRUNCATED),
    ]
    assert result.rounds[0].plan.stop == "OTHER"  # truncation used up the compute budget
    assert result.oom is None
    assert "C" in result.pending


def test_abc_reserve_tail_rejects_c(run_scenario):
    result = run_scenario(
        "seed-abc", "admission=reserve-tail,chunking=sglang,alignment=checkpoint:256"
    )
    assert [(r.request_id, r.verdict) for r in result.rounds[0].plan.rejected] == [
        ("C", "NO_TOKEN")
    ]
    assert result.oom is None
