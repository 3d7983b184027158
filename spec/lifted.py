"""A policy method lifted once into a symbolic function of its view.

The model asks each policy hundreds of times per check, each time with a view of different z3
terms. The guard (and its cost) is paid once per (policy, method, view shape): the policy's
code runs watched, once per branch combination, on *fresh* variables, and the result is kept
here. That lifted function is what :mod:`policykit.spec.crossval` compares with the plain
Python policy. Because a policy must be a pure function of its view (the guard and the
cross-validation refuse anything else), its answer on any terms is the lifted function with
the fresh variables replaced by those terms. The model re-runs the already-watched code on
its own terms instead (:func:`evaluate`): the same value, with the branches those terms
rule out already dropped. (This module sits above :mod:`policykit.spec.symbolic`, which knows
nothing of lifting.)

A policy whose loops end only because the lifting followed no trip a view in the checked range
cannot take (:class:`policykit.spec.symbolic.Explorer`) is not re-run on the model's terms:
nothing there shows z3 where the loop ends. The model reads its lifted function instead,
instantiated at its terms (:func:`instantiate`).

A view's *shape* says which fields are concrete here (the page size, the hybrid flag, a
constant of the model) and their values: a policy may branch on those in Python, so each shape
is lifted on its own.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import z3

from policykit.spec.guard import Read, Swap, apply_swaps, changed, restore_swaps
from policykit.spec.symbolic import (
    Choice,
    DivisionSink,
    NonDeterministic,
    Sym,
    SymbolicEvaluationError,
    Unsupported,
    collect_divisions,
    explore,
    quotient,
    refused_who,
    reset_divisions,
    run_guarded,
)
from policykit.spec.views import symbolic_guarantees

Shape = tuple[tuple[str, Any], ...]


def _shape(view: Any) -> Shape:
    """For each field: ``("sym", None)`` or ``("int", value)`` / ``("bool", value)``."""
    out: list[tuple[str, Any]] = []
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
    paths: list[z3.BoolRef]  #: the condition of each path the policy's code took
    #: the module-level values the code read, as they were (a rebinding makes this stale)
    reads: dict[tuple[int, str], Read]
    #: the cached helpers its symbolic runs call uncached
    swaps: list[Swap]
    #: a loop's side was left out as impossible for inputs in the checked range: the model
    #: then reads this function rather than re-running the code (:func:`evaluate`)
    cut: bool = False
    #: set once :mod:`policykit.spec.crossval` has compared this with the Python policy
    validated: bool = False


#: lifted functions per policy *value*: its class and what its instance holds (the registry
#: makes a new instance for every combo; the same class and state decide the same way)
#: (terms belong to one z3 context: a new context, as each spec test makes, starts afresh)
_LIFTED: dict[tuple[z3.Context, type, str], dict[tuple[str, Shape], Lifted]] = {}


def _identity(policy: Any) -> tuple[z3.Context, type, str]:
    state = sorted((k, repr(v)) for k, v in vars(policy).items() if k != "source")
    return z3.main_ctx(), type(policy), repr(state)


def entries(policy: Any) -> list[tuple[tuple[str, Shape], Lifted]]:
    """Every function lifted from ``policy`` so far: ((method, shape), lifted)."""
    return list(_LIFTED.get(_identity(policy), {}).items())


def forget_stale(policy: Any) -> None:
    """Drop what was lifted from ``policy`` before a module-level value its code read was
    rebound (or a frozen record mutated): a check starting reads the module as it is now."""
    per_policy = _LIFTED.get(_identity(policy), {})
    for key in [k for k, lifted in per_policy.items() if changed(lifted.reads) is not None]:
        del per_policy[key]


@contextmanager
def scratch_context() -> Iterator[None]:
    """Make z3 terms in a context of their own, dropped on the way out.

    A question asked of a policy beside the check itself (does it read a field the model has
    no values for?) must leave the check's context as it found it: fresh constants made there
    shift the numbering of the model's own, and z3's search, and so a verdict reached within
    a resource budget, follows that numbering."""
    saved = z3.z3._main_ctx
    z3.z3._main_ctx = scratch = z3.Context()
    try:
        yield
    finally:
        z3.z3._main_ctx = saved
        for key in [k for k in _LIFTED if k[0] is scratch]:
            del _LIFTED[key]


def lift(policy: Any, method: str, view: Any, *, source: str = "built-in") -> Lifted:
    """The lifted ``policy.method`` for views shaped like ``view`` (made on first use).

    A module-level value the code read may have changed since it was lifted: between checks
    :func:`forget_stale` lifts it anew; here, in the middle of a check, the policy is refused
    (the checker would be reasoning about two different programs)."""
    per_policy = _LIFTED.setdefault(_identity(policy), {})
    key = (method, _shape(view))
    lifted = per_policy.get(key)
    if lifted is None:
        lifted = per_policy[key] = _make(policy, method, view, source)
    stale = changed(lifted.reads)
    if stale is not None:
        raise SymbolicEvaluationError(
            f"{refused_who(policy, source, method)} cannot be checked: {stale} "
            f"during the check ({method}()), so the scheduler may run another policy than the "
            "one checked. Keep module-level constants constant."
        )
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
        assume = tuple(symbolic_guarantees(view, inputs))
        result, paths, guard, cut = run_guarded(policy, method, fresh, source=source, assume=assume)
    finally:
        reset_divisions(token)
    return Lifted(inputs, result, list(sink.quotients), paths, guard.reads, guard.swaps, cut)


def evaluate(policy: Any, method: str, view: Any, *, source: str = "built-in") -> Any:
    """``policy.method(view)`` as one symbolic value.

    The first time a (policy, method, view shape) is asked, the policy's code is run under the
    guard on fresh variables and lifted, which is what cross-validation compares with Python.
    Every call then runs the same code on this view's own terms, unwatched: those paths are a
    subset of the ones the guard already followed (a pure function takes no other), and
    deciding on the real terms lets z3's simplifier drop the branches they rule out, which
    keeps the model's formulas as small as before.
    """
    lifted = lift(policy, method, view, source=source)
    if lifted.cut:
        return instantiate(lifted, view)
    apply_swaps(lifted.swaps)
    try:
        return explore(lambda: getattr(policy, method)(view), loops=True).merged()
    except (Unsupported, NonDeterministic, Exception) as exc:
        raise SymbolicEvaluationError(
            f"{refused_who(policy, source, method)} answered differently on the "
            f"model's terms than on fresh variables ({type(exc).__name__}: {exc}); a pure "
            "function cannot."
        ) from None
    finally:
        restore_swaps(lifted.swaps)


def instantiate(lifted: Lifted, view: Any) -> Any:
    """The lifted function at ``view``'s terms: its fresh variables replaced by them, and each
    of its floor divisions made again on the replaced term (in the model's own division sink).

    Used where the lifting left out a loop's side as impossible in the checked range: re-run on
    the model's terms, which z3 cannot bound by looking, the code would loop on. The function
    is the one cross-validation compared with Python; like every verdict, it speaks for views
    within the range (``±LIMIT`` per value)."""
    pairs = [(var, getattr(view, name).t) for name, var in lifted.inputs.items()]
    for x, d, q in lifted.quotients:
        pairs.append((q, quotient(_substituted(x, pairs), d)))

    def at(term: Any) -> Any:
        return _substituted(term, pairs)

    result = lifted.result
    if isinstance(result, Choice):
        return Choice({value: at(cond) for value, cond in result.when.items()})
    return type(result)(at(result.t))


def _substituted(term: Any, pairs: list[tuple[z3.ArithRef, z3.ArithRef]]) -> Any:
    return z3.substitute(term, *pairs) if pairs else term
