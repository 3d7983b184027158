"""The restart schedule of ``policykit.spec.solver``: what it tries, that it stays honest, and
that its answers are counted in z3 resource units (the same anywhere), not seconds."""

from __future__ import annotations

import time

import z3
from hypothesis import given
from hypothesis import strategies as st

from policykit.spec.solver import (
    BUDGET_SPENT,
    DEFAULT_ARITH,
    FIRST_TRY_RLIMIT,
    LEGACY_ARITH,
    OBLIGATION,
    QUERY_RLIMIT,
    WALL_CLOCK,
    Portfolio,
    solve,
    unrolled,
)


@given(
    first=st.integers(1, 5000),
    budget=st.integers(1, 200_000),
    both=st.booleans(),
)
def test_tries_spend_exactly_the_budget_with_fresh_seeds(first, budget, both) -> None:
    solvers = (DEFAULT_ARITH, LEGACY_ARITH) if both else (DEFAULT_ARITH,)
    tries = list(Portfolio(first, solvers).tries(budget))
    assert sum(t.rlimit for t in tries) == budget
    assert all(t.rlimit >= 1 for t in tries)
    assert len({t.seed for t in tries}) == len(tries)
    # no try but the last is shorter than the first one, and none is cut to a sliver
    assert all(t.rlimit >= min(first, budget) for t in tries[:-1])


def test_obligations_alternate_solvers_and_grow() -> None:
    first = OBLIGATION.first
    tries = list(OBLIGATION.tries(100 * first))
    assert [t.arith for t in tries[:4]] == [DEFAULT_ARITH, LEGACY_ARITH] * 2
    assert [t.rlimit // first for t in tries[:8]] == [1, 1, 1, 1, 2, 2, 4, 4]


def test_unrolled_formulas_start_from_the_expected_effort() -> None:
    big = 3 * FIRST_TRY_RLIMIT
    tries = list(unrolled(big).tries(100 * big))
    assert {t.arith for t in tries} == {DEFAULT_ARITH}
    assert tries[0].rlimit == big
    assert unrolled(0).first == FIRST_TRY_RLIMIT


def test_answers_and_models() -> None:
    x = z3.Int("x")
    result, model, _ = solve([x > 3, x < 5])
    assert result == z3.sat and model is not None and model[x].as_long() == 4
    result, model, _ = solve([x > 3, x < 4])
    assert result == z3.unsat and model is None


def _hopeless() -> list[z3.BoolRef]:
    # x^3 + y^3 == z^3 with positive integers: nonlinear, hopeless on a small budget
    x, y, z = z3.Ints("x y z")
    return [x > 0, y > 0, z > 0, x * x * x + y * y * y == z * z * z]


def test_out_of_budget_is_unknown_not_an_answer() -> None:
    outcome = solve(_hopeless(), 20_000)
    assert outcome.result == z3.unknown and outcome.model is None
    assert outcome.reason == BUDGET_SPENT
    assert outcome.spent >= 20_000


def test_the_wall_clock_net_says_it_cut_the_query_short() -> None:
    outcome = solve(_hopeless(), QUERY_RLIMIT, deadline=time.time() - 1)
    assert (outcome.result, outcome.reason) == (z3.unknown, WALL_CLOCK)


def test_the_effort_spent_is_the_same_every_time_whatever_came_before() -> None:
    """Each try runs in a fresh context: terms made before (in the caller's context) do not
    change what z3 spends on the query, nor its answer."""
    x, y = z3.Ints("x y")
    facts = [x * x + y * y == 625, x > 0, y > 0, x != y]
    first = solve(facts)
    _ = [z3.Int(f"noise{i}") * i for i in range(2000)]
    again = solve(facts)
    assert first.result == again.result == z3.sat
    assert first.spent == again.spent
    assert first.model[x].as_long() == again.model[x].as_long()
