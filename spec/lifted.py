"""A policy method lifted once into a symbolic function of its view.

The model asks each policy hundreds of times per check, each time with a view of different z3
terms. Because a policy must be a pure function of its view (the guard and the cross-validation
refuse anything else), its answer on *fresh* variables, with those variables then replaced by
the terms at hand, is its answer on those terms. So the policy's code runs — guarded, once per
branch combination — only the first time a (policy, method, view shape) is asked; every later
call is a substitution. The lifted function is also exactly what
:mod:`policykit.spec.crossval` compares with the plain Python policy, so the formula the
checker reasons about is the one that was cross-validated.

A view's *shape* says which fields are concrete here (the page size, the hybrid flag, a
constant of the model) and their values: a policy may branch on those in Python, so each shape
is lifted on its own.
"""

from __future__ import annotations

import dataclasses
import weakref
from dataclasses import dataclass
from typing import Any

import z3

from policykit.spec.symbolic import (
    Choice,
    DivisionSink,
    Sym,
    SymBool,
    collect_divisions,
    quotient,
    reset_divisions,
    run_guarded,
)

Shape = tuple[tuple[str, Any], ...]


def _shape(view: Any) -> Shape:
    """For each field: ``("sym", None)`` or ``("int", value)`` / ``("bool", value)``."""
    out = []
    for f in dataclasses.fields(view):
        value = getattr(view, f.name)
        if isinstance(value, Sym):
            out.append(("sym", None))
        elif isinstance(value, bool | int):
            out.append((type(value).__name__, value))
        else:
            raise TypeError(f"view field {f.name} holds {type(value).__name__}")
    return tuple(out)


@dataclass
class Lifted:
    """``policy.method`` on a view of fresh variables, with the floor divisions it made."""

    inputs: dict[str, z3.ArithRef]  #: field name -> its fresh variable
    result: Any  #: Sym, SymBool or Choice over the fresh variables
    quotients: list[tuple[z3.ArithRef, int, z3.ArithRef]]

    def fresh_view(self, view: Any) -> Any:
        """``view`` with every symbolic field replaced by its fresh variable."""
        return dataclasses.replace(view, **{k: Sym(v) for k, v in self.inputs.items()})

    def instantiate(self, view: Any) -> Any:
        """The lifted answer with the fresh variables replaced by ``view``'s terms."""
        pairs = [(var, getattr(view, name).t) for name, var in self.inputs.items()]
        for x, d, q in self.quotients:
            pairs.append((q, quotient(z3.substitute(x, *pairs) if pairs else x, d)))
        return self._map(lambda term: z3.substitute(term, *pairs) if pairs else term)

    def _map(self, f: Any) -> Any:
        r = self.result
        if isinstance(r, Sym):
            return Sym(f(r.t))
        if isinstance(r, SymBool):
            return SymBool(f(r.t))
        return Choice({value: f(cond) for value, cond in r.when.items()})


_LIFTED: weakref.WeakKeyDictionary[Any, dict[tuple[str, Shape], Lifted]] = (
    weakref.WeakKeyDictionary()
)


def lift(policy: Any, method: str, view: Any, *, source: str = "built-in") -> Lifted:
    """The lifted ``policy.method`` for views shaped like ``view`` (made on first use)."""
    per_policy = _LIFTED.setdefault(policy, {})
    key = (method, _shape(view))
    lifted = per_policy.get(key)
    if lifted is None:
        lifted = per_policy[key] = _make(policy, method, view, source)
    return lifted


def _make(policy: Any, method: str, view: Any, source: str) -> Lifted:
    inputs = {
        f.name: z3.FreshInt(f.name)
        for f in dataclasses.fields(view)
        if isinstance(getattr(view, f.name), Sym)
    }
    fresh = dataclasses.replace(view, **{k: Sym(v) for k, v in inputs.items()})
    sink = DivisionSink()
    token = collect_divisions(sink)
    try:
        result = run_guarded(policy, method, fresh, source=source)
    finally:
        reset_divisions(token)
    if isinstance(result, bool | int):
        result = SymBool(z3.BoolVal(result)) if isinstance(result, bool) else Sym(z3.IntVal(result))
    return Lifted(inputs, result, list(sink.quotients))
