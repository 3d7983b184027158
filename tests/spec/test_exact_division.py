"""Exact divisions need no quotient (``policykit.spec.exact_division``), and keep their meaning.

The ledger's branch-free ``min``/``max`` (``(a + b -|a - b|) // 2``) used to make a quotient
variable per call; with hybrid SWA those were most of an unrolled formula's cost. Each result is
checked against Python's ``//`` by z3 over all integers, not on samples.
"""

from __future__ import annotations

import z3

from policykit.ledger import maximum, minimum, swa_estimate
from policykit.spec.encoding import Encoder
from policykit.spec.exact_division import exact_quotient
from policykit.spec.symbolic import Sym


def _same_everywhere(term: z3.ArithRef, expected: z3.ArithRef, facts: list) -> bool:
    solver = z3.Solver()
    solver.add(*facts, term != expected)
    return solver.check() == z3.unsat


def test_min_and_max_make_no_quotient_and_stay_exact():
    a, b = z3.Ints("a b")
    with Encoder() as enc:
        lo, hi = minimum(Sym(a), Sym(b)), maximum(Sym(a) - 512, 0)
    assert enc.facts == [] and enc.divisions.quotients == []
    assert _same_everywhere(lo.t, z3.If(a <= b, a, b), [])
    assert _same_everywhere(hi.t, z3.If(a >= 512, a - 512, 0), [])


def test_the_sliding_window_estimate_makes_no_quotient():
    """A min inside a max (the estimate's part beyond the window) is split into its four
    branches, the two impossible combinations left out."""
    extend, limit = z3.Ints("extend limit")
    with Encoder() as enc:
        est = swa_estimate(Sym(extend), 1, 512, 64, Sym(limit))
    assert enc.facts == []
    chunk = z3.If(extend <= limit, extend, limit)
    window_part = z3.If(extend + 1 <= 512, extend + 1, 512)
    expected = z3.If(chunk >= 512, chunk - 512, 0) + window_part + 64
    assert _same_everywhere(est.t, expected, [])


def test_an_inexact_division_keeps_its_quotient():
    a, c = z3.Int("a"), z3.Bool("c")
    assert exact_quotient(a + 1, 2) is None  # no branch: a plain sum
    assert exact_quotient(z3.If(c, 2 * a, a), 2) is None  # one branch not divisible
    with Encoder() as enc:
        half = Sym(z3.If(c, 2 * a, a)) // 2
    assert len(enc.divisions.quotients) == 1
    assert _same_everywhere(half.t, z3.If(c, a, a / 2), enc.facts)


def test_a_divisible_branching_term_divides_each_branch():
    a, b, c = z3.Int("a"), z3.Int("b"), z3.Bool("c")
    got = exact_quotient(4 * a + z3.If(c, 8 * b, -4), 4)
    assert got is not None
    assert _same_everywhere(got, a + z3.If(c, 2 * b, -1), [])


def test_a_side_of_too_many_branches_keeps_its_quotient():
    """An ``If`` one of whose sides splits into more than ``MAX_BRANCHES`` branches gives no
    exact quotient (it used to raise ``TypeError`` while unpacking that side)."""
    a, b = z3.Int("a"), z3.Int("b")
    cs = z3.Bools("c0 c1 c2 c3")
    many = sum((z3.If(c, 2 * a, 2 * b) for c in cs), z3.IntVal(0))  # 16 branches
    assert exact_quotient(z3.If(z3.Bool("d"), many, 2 * a), 2) is None
