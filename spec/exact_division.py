"""Floor divisions that need no quotient: ``x // d`` where ``d`` divides ``x`` on every branch.

The ledger writes ``min`` and ``max`` without a branch, as ``(a + b -|a - b|) // 2`` (it runs on
symbolic integers outside any policy evaluation, where it cannot branch). The halving is always
exact, but a quotient variable with ``2q <= x < 2q + 2`` hides that: z3 must rediscover the
parity of ``x`` by branch and bound, for every ``min`` of every charge of every round. With
hybrid SWA each admission makes about ten of them (the window-capped sliding-window estimate),
and they were most of the cost of the unrolled formulas: the round-1 ``swa-no-oom`` query of
``sglang/sglang/none`` at window 512 took 3.0 s with them and 0.17 s without.

Here the term is split into its branches (each if-then-else lifted out of the sums it sits in),
each branch a linear sum. When ``d`` divides every coefficient and constant of every branch,
``x // d`` is the same if-then-else over the branches divided by ``d``: an identity, not an
approximation, so nothing is lost. ``|a - b|`` has two branches, ``a - b`` and ``b - a``, on
which ``a + b - |a - b|`` is ``2b`` and ``2a``: ``min(a, b)`` comes out as ``If(a <= b, a, b)``.
Anything else keeps its quotient.
"""

from __future__ import annotations

import itertools

import z3

#: the most branches a term is split into (a min inside a max is four); beyond, keep the quotient
MAX_BRANCHES = 8

#: a linear sum: atom id -> (atom, coefficient); the constant under key ``None``
Linear = dict[int | None, tuple[z3.ArithRef | None, int]]


#: a branch's condition: the if-then-else conditions it takes, by term id -> (condition, taken)
Guard = dict[int, tuple[z3.BoolRef, bool]]


def exact_quotient(x: z3.ArithRef, d: int) -> z3.ArithRef | None:
    """``x // d`` without a quotient where ``d`` divides ``x`` on every branch, else None."""
    branches = _branches(x)
    if branches is None or len(branches) < 2:
        return None  # a plain linear sum: z3's own simplifier already divides what it can
    out: list[tuple[z3.BoolRef, z3.ArithRef]] = []
    for guard, lin in branches:
        if any(c % d for _, c in lin.values()):
            return None
        literals = [c if taken else z3.Not(c) for c, taken in guard.values()]
        out.append((z3.And(*literals), _rebuild(lin, d)))
    term = out[-1][1]
    for cond, value in reversed(out[:-1]):
        term = z3.If(cond, value, term)
    return term


def _branches(x: z3.ArithRef) -> list[tuple[Guard, Linear]] | None:
    """``x`` as (guard, linear sum) pairs whose guards partition every state (combinations
    that take both sides of one condition are left out), or None when that takes more than
    :data:`MAX_BRANCHES`."""
    if z3.is_int_value(x):
        return [({}, {None: (None, x.as_long())})]
    if z3.is_app_of(x, z3.Z3_OP_ITE):
        c, a, b = x.children()
        out = []
        for taken, side in ((True, a), (False, b)):
            sides = _branches(side)
            if not sides:  # too many branches (or none left): no exact quotient
                return None
            for side_guard, side_lin in sides:
                joined = _join([{c.get_id(): (c, taken)}, side_guard])
                if joined is not None:
                    out.append((joined, side_lin))
        return out if len(out) <= MAX_BRANCHES else None
    if z3.is_add(x) or z3.is_sub(x):
        branched = [_branches(child) for child in x.children()]
        parts = [p for p in branched if p is not None]
        if len(parts) < len(branched):
            return None
        signs = [1] + [-1 if z3.is_sub(x) else 1] * (len(parts) - 1)
        out = []
        for combo in itertools.product(*parts):
            guard = _join([g for g, _ in combo])
            if guard is None:
                continue
            if len(out) == MAX_BRANCHES:
                return None
            lin: Linear = {}
            for sign, (_, part) in zip(signs, combo, strict=True):
                _add(lin, part, sign)
            out.append((guard, lin))
        return out
    if z3.is_mul(x) and len(x.children()) == 2 and z3.is_int_value(x.arg(0)):
        inner = _branches(x.arg(1))
        k = x.arg(0).as_long()
        return None if inner is None else [(g, _scaled(lin, k)) for g, lin in inner]
    if z3.is_app_of(x, z3.Z3_OP_UMINUS):
        inner = _branches(x.arg(0))
        return None if inner is None else [(g, _scaled(lin, -1)) for g, lin in inner]
    return [({}, {x.get_id(): (x, 1)})]


def _join(guards: list[Guard]) -> Guard | None:
    """The conditions of several guards together; None where two take opposite sides."""
    out: Guard = {}
    for guard in guards:
        for key, (cond, taken) in guard.items():
            if out.get(key, (cond, taken))[1] != taken:
                return None
            out[key] = (cond, taken)
    return out


def _add(into: Linear, lin: Linear, sign: int) -> None:
    for key, (atom, c) in lin.items():
        old = into.get(key, (atom, 0))[1]
        into[key] = (atom, old + sign * c)


def _scaled(lin: Linear, k: int) -> Linear:
    return {key: (atom, k * c) for key, (atom, c) in lin.items()}


def _rebuild(lin: Linear, d: int) -> z3.ArithRef:
    terms = [
        z3.IntVal(c // d) if atom is None else (c // d) * atom for atom, c in lin.values() if c != 0
    ]
    return z3.simplify(z3.Sum(terms)) if terms else z3.IntVal(0)
