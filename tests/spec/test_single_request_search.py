"""Where a bounded query gives up, ``check`` searches a single request from that round on.

The full search is made to give up here (every query with a second request is answered
``unknown``), so what is tested is the fallback alone: it finds the hybrid-SWA counterexample of
the upstream-faithful combo with one request, reports it with a note, and stays ``unknown``
where one request cannot violate the property.
"""

from __future__ import annotations

import pytest
import z3

from policykit.config import EngineConfig
from policykit.spec import checker
from policykit.spec.bmc import Bounds
from policykit.spec.checker import CheckOptions, check_combo
from policykit.spec.solver import BUDGET_SPENT, Outcome

HYBRID = EngineConfig(page_size=64, chunked_prefill_size=4096, sliding_window=512)
COMBO = "admission=sglang,chunking=sglang,alignment=none,queue=fcfs"


@pytest.fixture
def full_search_gives_up(monkeypatch):
    """Answer ``unknown`` to every query about more than one request (the inputs' range facts
    come first, one per variable, so a second request's prompt shows in the first few)."""
    real = checker.solve

    def solve(facts, *args):
        if any("prompt1!" in str(f) for f in facts[:16]):
            return Outcome(z3.unknown, None, BUDGET_SPENT, 0)
        return real(facts, *args)

    monkeypatch.setattr(checker, "solve", solve)


@pytest.mark.slow
def test_a_single_request_finds_what_the_full_search_gave_up_on(registry, full_search_gives_up):
    # a larger budget than the default: since a load-back charges its hit's last window (the
    # cap is one more case split in every admission), the one-request query at round 3 needs
    # more than 60,000,000 units (150,000,000 were enough on 2026-12-02)
    options = CheckOptions(properties=("admitted-completes",), rlimit=150_000_000)
    (verdict,) = check_combo(registry.resolve(COMBO), HYBRID, options)
    assert (verdict.verdict, verdict.bound) == ("violated", "round 3")
    assert "single request" in verdict.note and "gave up at round 1" in verdict.note
    assert verdict.counterexample.failure.detail == "stuck"
    assert [r["id"] for r in verdict.counterexample.scenario["requests"]] == ["A"]


def test_nothing_found_alone_stays_unknown(registry, full_search_gives_up):
    """On pools SGLang 0.5.23 starts with, one request alone is never stuck (3 rounds)."""
    options = CheckOptions(
        rounds=3,
        rlimit=20_000_000,
        properties=("admitted-completes",),
        bounds=Bounds(min_swa_pool_tokens=512 + 64 + 1),
    )
    (verdict,) = check_combo(registry.resolve(COMBO), HYBRID, options)
    assert (verdict.verdict, verdict.bound) == ("unknown", "round 1")
