"""The between-round rules (:mod:`policykit.kernel.between`) decide alike on ints and terms.

SGLang's node and the node that preempts ask them on ints about the requests they hold; the
checker's models ask them on z3 terms about every request at once. Each rule is run both ways
on the same concrete inputs: the terms, with the inputs fixed, must take the values the ints
took.
"""

from __future__ import annotations

import z3
from hypothesis import given, settings
from hypothesis import strategies as st

from policykit import kernel
from policykit.config import EngineConfig
from policykit.kernel import Ints
from policykit.plugin_manager import make_plugin_manager
from policykit.registry import PolicyRegistry
from policykit.spec.encoding import Encoder, Terms, t
from policykit.spec.symbolic import Sym, num

COMBO = next(
    iter(
        PolicyRegistry.from_plugins(make_plugin_manager(entry_points=False)).all_combos(
            EngineConfig(64, 512)
        )
    )
)
INTS = Ints(COMBO)


def _on_terms(rule, *args):  # type: ignore[no-untyped-def]
    """``rule`` on the z3 domain, every number and truth value a constant, evaluated."""
    with Encoder() as enc:
        out = rule(Terms(enc, COMBO, {}), *args)
        solver = z3.Solver()
        solver.add(*enc.facts)
        assert solver.check() == z3.sat
        v = solver.model().eval(t(out), model_completion=True)
        return z3.is_true(v) if z3.is_bool(v) else v.as_long()


def _sym(v: int) -> Sym:
    return Sym(num(v))


def _bool(v: bool) -> z3.BoolRef:
    return z3.BoolVal(v)


@settings(max_examples=60)
@given(finished=st.integers(0, 9), delay=st.integers(0, 4), round_no=st.integers(1, 14))
def test_kv_back_is_the_same_round_on_both(finished: int, delay: int, round_no: int) -> None:
    on_ints = kernel.kv_back(finished, delay, round_no)
    assert on_ints == (finished + delay <= round_no)
    v = z3.simplify(kernel.kv_back(_sym(finished), _sym(delay), round_no).t)
    assert z3.is_true(v) == on_ints


@settings(max_examples=60)
@given(
    finished=st.integers(0, 5),
    released=st.lists(st.booleans(), max_size=2),
    never=st.booleans(),
    computed=st.booleans(),
    going=st.lists(st.booleans(), min_size=1, max_size=3),
)
def test_due_and_stuck_agree(
    finished: int, released: list[bool], never: bool, computed: bool, going: list[bool]
) -> None:
    due = kernel.kv_due(INTS, finished, released, never)
    assert due == (finished > 0 and not any(released) and not never)
    assert due == _on_terms(
        kernel.kv_due, _sym(finished), [_bool(r) for r in released], _bool(never)
    )
    stuck = kernel.stuck(INTS, computed, due, going)
    assert stuck == (not computed and not due and all(going))
    assert stuck == _on_terms(kernel.stuck, _bool(computed), _bool(due), [_bool(g) for g in going])


@settings(max_examples=60)
@given(
    busy=st.lists(st.booleans(), max_size=3),
    holding=st.lists(st.booleans(), max_size=3),
    could=st.lists(st.booleans(), min_size=1, max_size=3),
    placed=st.lists(st.booleans(), min_size=1, max_size=3),
)
def test_drained_and_starves_agree(
    busy: list[bool], holding: list[bool], could: list[bool], placed: list[bool]
) -> None:
    drained = kernel.drained(INTS, busy, holding)
    assert drained == (not any(busy) and not any(holding))
    assert drained == _on_terms(
        kernel.drained, [_bool(b) for b in busy], [_bool(h) for h in holding]
    )
    starves = kernel.starves(INTS, drained, could, placed)
    assert starves == (drained and any(could) and not any(placed))
    terms = _on_terms(
        kernel.starves, _bool(drained), [_bool(c) for c in could], [_bool(p) for p in placed]
    )
    assert starves == terms


@settings(max_examples=60)
@given(
    baseline=st.integers(0, 4096),
    held=st.lists(st.tuples(st.booleans(), st.integers(0, 512)), max_size=4),
)
def test_reclaimable_agrees(baseline: int, held: list[tuple[bool, int]]) -> None:
    due, gives = [d for d, _ in held], [g for _, g in held]
    on_ints = kernel.reclaimable(INTS, baseline, due, gives)
    assert on_ints == baseline + sum(g for d, g in held if d)
    terms = _on_terms(
        kernel.reclaimable, _sym(baseline), [_bool(d) for d in due], [_sym(g) for g in gives]
    )
    assert terms == on_ints


@settings(max_examples=60)
@given(round_no=st.integers(1, 100), sorts=st.integers(0, 99))
def test_refresh_is_due_on_the_first_sort_and_every_32nd_after(round_no: int, sorts: int) -> None:
    sorts = min(sorts, round_no - 1)  # at most one sort a round, before this one
    on_ints = kernel.refresh_due(INTS, sorts, round_no)
    assert on_ints == (sorts % kernel.WAITING_PREFIX_REFRESH_INTERVAL == 0)
    assert on_ints == _on_terms(kernel.refresh_due, _sym(sorts), round_no)
