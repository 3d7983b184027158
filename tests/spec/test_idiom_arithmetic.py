"""The idioms' arithmetic means on symbols what it means on Python ints, and loops end or refuse.

Masks, negative divisors, ``bit_length`` and ``while`` loops are run on a symbolic ``x`` (one
lifting, as the checker does) and the merged term is compared with Python at many points; a
loop whose bound cannot be seen is refused at once, naming the construct.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import pytest
import z3
from hypothesis import given, settings
from hypothesis import strategies as st

from policykit.spec.symbolic import LIMIT, Sym, Unsupported, explore, num


def _x() -> z3.ArithRef:
    """The symbolic ``x`` (in the test's own z3 context: each test makes a new one)."""
    return z3.Int("x")


def _lifted(fn: Callable[[Any], Any], *, at_least: int | None = None) -> Any:
    """``fn`` on a symbolic ``x``, every path merged (pruned as a lifting is), assuming
    ``x >= at_least`` as a view's guarantee would."""
    assume = () if at_least is None else (_x() >= at_least,)
    return explore(lambda: fn(Sym(_x())), loops=True, prune=True, assume=assume)


def _at(outcome: Any, x: int) -> int:
    return z3.simplify(z3.substitute(outcome.merged().t, (_x(), num(x)))).as_long()


MASKS = [m for k in range(9) for m in ((1 << k) - 1, -(1 << k))]


@settings(max_examples=200, deadline=None)
@given(x=st.integers(-LIMIT, LIMIT), m=st.sampled_from(MASKS), op=st.sampled_from("&|^"))
def test_a_page_mask_is_exact_for_every_int(x: int, m: int, op: str) -> None:
    ops = {"&": lambda a: a & m, "|": lambda a: a | m, "^": lambda a: a ^ m}
    rops = {"&": lambda a: m & a, "|": lambda a: m | a, "^": lambda a: m ^ a}
    for fn in (ops[op], rops[op]):
        assert _at(_lifted(fn), x) == fn(x)


@settings(max_examples=100, deadline=None)
@given(x=st.integers(-LIMIT, LIMIT), d=st.integers(-300, 300).filter(bool))
def test_division_by_a_negative_int_floors_as_python_does(x: int, d: int) -> None:
    for fn in (lambda a: a // d, lambda a: a % d, lambda a: -(a // -d)):
        assert _at(_lifted(fn), x) == fn(x)


def _next_power_of_2(n: Any) -> Any:
    return 1 if n < 1 else 1 << (n - 1).bit_length()


def _halve(x: Any) -> Any:
    while x > 64:
        x //= 2
    return x


def _double(x: Any) -> Any:
    p = 1
    while p < x:
        p <<= 1
    return p


@pytest.mark.parametrize("fn", [_next_power_of_2, _halve, _double], ids=lambda f: f.__name__)
def test_a_loop_bounded_by_the_range_ends_and_equals_python(fn) -> None:
    outcome = _lifted(fn)
    assert outcome.cut and len(outcome.paths) < 64
    for x in (-LIMIT, -65, -1, 0, 1, 2, 63, 64, 65, 4096, 4097, 300_000, LIMIT - 1, LIMIT):
        assert _at(outcome, x) == fn(x), x


def _count_pages(x: Any) -> Any:
    if x > 16 * 64:
        return -1
    pages, i = -(-x // 64), 0
    count = 0
    while i < pages:
        count += 1
        i += 1
    return count


def test_a_counter_bounded_on_the_path_ends_and_equals_python() -> None:
    outcome = _lifted(_count_pages, at_least=1)
    for x in (1, 63, 64, 65, 1000, 16 * 64, 16 * 64 + 1, LIMIT):
        assert _at(outcome, x) == _count_pages(x), x


def _halve_by_need(x: Any) -> Any:
    bucket = LIMIT
    while bucket >= 2 * x:  # never ends for x <= 0: Python spins at -1 // 2 == -1 too
        bucket //= 2
    return bucket


def test_a_loop_bounded_by_what_the_view_guarantees_ends_with_the_guarantee() -> None:
    with pytest.raises(Unsupported, match="a loop whose bound the checker cannot see"):
        _lifted(_halve_by_need)
    outcome = _lifted(_halve_by_need, at_least=1)
    for x in (1, 2, 3, 1000, LIMIT):
        assert _at(outcome, x) == _halve_by_need(x), x


def _creep(x: Any) -> Any:
    need = 0
    while need < x:
        need += 64
    return need


def test_a_loop_whose_bound_cannot_be_seen_is_refused_at_once() -> None:
    started = time.perf_counter()
    with pytest.raises(Unsupported, match="more than 128 times on one path: a loop whose bound"):
        _lifted(_creep)
    assert time.perf_counter() - started < 10


def test_a_raise_on_a_path_no_view_takes_is_not_the_policys() -> None:
    """``n.bit_length() - 1`` is -1 only for ``n == 0``, which the guard clause rules out:
    the shift by -1 (a ValueError in Python) is on a path no view takes."""
    outcome = _lifted(lambda n: 0 if n < 1 else 1 << (n.bit_length() - 1))
    for x in (-5, 0, 1, 2, 3, 64, 100, LIMIT):
        assert _at(outcome, x) == (0 if x < 1 else 1 << (x.bit_length() - 1)), x


@pytest.mark.parametrize(
    ("fn", "message"),
    [
        (lambda x: x & (x - 1), "'&' between two symbolic values"),
        (lambda x: x & 96, "'&' with the mask 96"),
        (lambda x: 1 << x, "a symbolic value as a shift count (<<)"),
        (lambda x: x**2, "uses a power"),
    ],
    ids=["two-symbols", "odd-mask", "symbolic-shift", "power"],
)
def test_a_bitwise_construct_that_is_not_linear_is_refused_by_name(fn, message) -> None:
    with pytest.raises(Unsupported, match=message.replace("(", r"\(").replace(")", r"\)")):
        _lifted(fn)


def _parity_bits(x: Any) -> Any:
    bits = 0
    for k in range(10):
        bits += (x >> k) & 1 == 1
    return bits


@pytest.mark.slow
def test_too_many_paths_are_refused_naming_where_they_branch() -> None:
    """2**10 feasible paths: past 512 the evaluation is refused, at the busiest line."""
    with pytest.raises(Unsupported, match=r"more than 512 paths \(most of them at .*py:\d+\)"):
        explore(lambda: _parity_bits(Sym(_x())), loops=True)
