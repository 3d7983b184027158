"""The restart schedule of ``policykit.spec.solver``: what it tries, and that it stays honest."""

from __future__ import annotations

import z3
from hypothesis import given
from hypothesis import strategies as st

from policykit.spec.solver import (
    DEFAULT_ARITH,
    LEGACY_ARITH,
    OBLIGATION,
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
    assert sum(t.limit_ms for t in tries) == budget
    assert all(t.limit_ms >= 1 for t in tries)
    assert len({t.seed for t in tries}) == len(tries)
    # no try but the last is shorter than the first one, and none is cut to a sliver
    assert all(t.limit_ms >= min(first, budget) for t in tries[:-1])


def test_obligations_alternate_solvers_and_grow() -> None:
    tries = list(OBLIGATION.tries(10_000))
    assert [t.arith for t in tries[:4]] == [DEFAULT_ARITH, LEGACY_ARITH] * 2
    assert [t.limit_ms for t in tries[:8]] == [250, 250, 250, 250, 500, 500, 1000, 1000]


def test_unrolled_formulas_start_from_the_expected_time() -> None:
    tries = list(unrolled(1200).tries(10_000))
    assert {t.arith for t in tries} == {DEFAULT_ARITH}
    assert tries[0].limit_ms == 1200
    assert unrolled(0).first_ms == 250


def test_answers_and_models() -> None:
    x = z3.Int("x")
    result, model, _ = solve([x > 3, x < 5], 5000)
    assert result == z3.sat and model is not None and model[x].as_long() == 4
    result, model, _ = solve([x > 3, x < 4], 5000)
    assert result == z3.unsat and model is None


def test_out_of_time_is_unknown_not_an_answer() -> None:
    # x^3 + y^3 == z^3 with positive integers: nonlinear, hopeless in a millisecond
    x, y, z = z3.Ints("x y z")
    facts = [x > 0, y > 0, z > 0, x * x * x + y * y * y == z * z * z]
    result, model, reason = solve(facts, 1)
    assert result == z3.unknown and model is None and reason
