"""A bounded verdict that reached fewer rounds than asked says so in the text, with the reason.

The search with unpinned device prefixes is made to give up from its second round on (every
later query answers ``unknown`` as if its budget ran out), so the verdict is proved to round 1
of the 2 asked: the text table must say "proved to round 1 of 2: <reason>", not only the JSON.
"""

from __future__ import annotations

import json

import pytest
import z3

from policykit.plugin_manager import make_plugin_manager
from policykit.spec import checker
from policykit.spec.solver import BUDGET_SPENT, Outcome

COMBO = "sglang/sglang/checkpoint:256"
ARGS = ("check", "--combo", COMBO, "--rounds", "2", "--requests", "2", "--jobs", "1")


@pytest.fixture
def unpinned_search_gives_up_after_round_1(monkeypatch):
    real = checker.solve
    seen = {"unpinned": 0}

    def solve(facts, *args):
        if any("unpinned" in str(f) for f in facts[:48]):
            seen["unpinned"] += 1
            if seen["unpinned"] > 1:
                return Outcome(z3.unknown, None, BUDGET_SPENT, 0)
        return real(facts, *args)

    monkeypatch.setattr(checker, "solve", solve)


def test_the_text_says_proved_to_round_k_of_k_and_why(cli, unpinned_search_gives_up_after_round_1):
    # a plugin manager handed in: the checking processes are forked from this one, so they
    # see the patched solver
    out = cli(*ARGS, "--verbose", pm=make_plugin_manager(), columns=300)
    assert out.exit_code == 1, out.output  # admitted-completes is violated (round 1)
    line = next(x for x in out.stdout.splitlines() if "no-oom: proved to round" in x)
    assert f"{COMBO} no-oom: proved to round 1 of 2: round 2 with unpinned device prefixes" in line
    assert "resource budget spent" in line


def test_the_json_has_the_rounds_reached_and_asked(cli, unpinned_search_gives_up_after_round_1):
    out = cli(*ARGS, "--json", pm=make_plugin_manager())
    row = next(v for v in json.loads(out.stdout)["verdicts"] if v["property"] == "no-oom")
    assert (row["bounds"]["rounds"], row["bounds"]["rounds_asked"]) == (1, 2)
    assert row["shortfall"].startswith("round 2 with unpinned device prefixes")


def test_a_verdict_the_wall_clock_net_cut_short_says_so_in_the_text(cli):
    """A one-second safety net is spent before the first query: every verdict the induction
    did not settle is ``unknown``, and the text says the net stopped it, not the budget."""
    out = cli("check", "--combo", "reserve-tail/sglang/page", "--timeout", "1", "--jobs", "1")
    assert out.exit_code == 3, out.output
    lines = [x for x in out.stdout.splitlines() if x.startswith("reserve-tail/sglang/page ")]
    assert lines and all("stopped by the wall-clock safety net" in x for x in lines)
    assert all("unknown at round 1" in x for x in lines)
