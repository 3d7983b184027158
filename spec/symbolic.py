"""Symbolic evaluation of ordinary Python policy code on z3 integers.

A policy is a pure function of a frozen view of ints. Here the view holds :class:`Sym` values
instead: z3 integer terms that overload ``+ - * // %``, comparisons and ``abs``. Arithmetic
builds terms; a comparison builds a :class:`SymBool`. The interesting moment is when Python
needs a *real* bool from a ``SymBool`` (an ``if``, ``and``/``or``, ``min``/``max``): the
:class:`Explorer` answers it from a list of decisions and re-runs the function once per
branch combination (a depth-first walk, the approach of CrossHair-style symbolic execution).
Each path's result, under its path condition, is merged into one nested z3 ``If``.

That is why the spec needs no second copy of any policy: it runs the very function the
scheduler runs. What cannot be followed symbolically (floats, division by a symbol, products
of two symbols, a function that takes different branches when re-run) raises
:class:`SymbolicEvaluationError`, which names the policy and the line, never a z3 stack trace.

Two places where Python wants something other than an int are followed where that is exact:
``math.ceil(a / b)`` and ``math.floor(a / b)`` of ints (:class:`Ratio`: Python's correctly
rounded float gives the integer ceiling and floor while ``|a| < 2**53``, which is proved or the
policy refused), and a symbol used where Python needs a concrete int (``range(n)``, an index,
``int(n)``) when the path bounds it to a few values: the evaluation forks once per value.

Exactness is the contract: every operation a :class:`Sym` accepts means what it means on a
Python ``int``, or it is refused. While a policy is explored, a comparison does not build a
symbolic truth value at all: it forks there and hands the policy a real ``bool``, so whatever
the policy does with it (``~``, ``== True``, ``is``, arithmetic: a bool is an int) is Python's
own behaviour on that path. The evaluator's signals derive from ``BaseException`` so that
``except Exception`` cannot swallow them, and :mod:`policykit.spec.guard` refuses a policy
that catches anything at all, or that steps outside its view (identity, state, clock).
"""

from __future__ import annotations

import contextvars
import enum
import itertools
import sys
import traceback
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from types import FrameType
from typing import Any, cast

import z3

from policykit.errors import PolicykitError
from policykit.policy import defined_at
from policykit.spec.exact_division import exact_quotient
from policykit.spec.guard import Breach, Guard, own_files, trusted

#: paths one evaluation may take before it is refused (a policy that loops on a symbol)
MAX_PATHS = 512


class SymbolicEvaluationError(PolicykitError):
    """A policy did something the symbolic evaluator cannot follow."""


class Unsupported(BaseException):
    """Raised inside policy code at the unsupported operation; turned into a readable error.

    A ``BaseException``, so ``except Exception`` in a policy does not swallow it; the active
    guard records it when it is made, so even ``except BaseException`` cannot hide it.
    """

    def __init__(self, message: str) -> None:
        super().__init__(message)
        guard = _GUARD.get()
        if guard is not None:
            guard.note(message, _first_untrusted_frame())


def _first_untrusted_frame() -> Any:
    frame: FrameType | None = sys._getframe(1)
    while frame is not None and trusted(frame.f_code):
        frame = frame.f_back
    return frame


IntLike = Any  # int | Sym


def _term(x: IntLike) -> z3.ArithRef:
    if isinstance(x, Sym):
        return x.t
    if isinstance(x, SymBool):
        return z3.If(x.t, num(1), num(0))
    if isinstance(x, bool):
        return num(int(x))
    if isinstance(x, int):
        return num(x)
    raise Unsupported(f"mixes a symbolic integer with a {type(x).__name__}")


def _compare(term: z3.BoolRef) -> Any:
    """A comparison's result: while a policy is explored, a real ``bool`` (the evaluation forks
    here), so that everything done with it afterwards is Python's own semantics; elsewhere (the
    model's own formulas) a :class:`SymBool`."""
    explorer = _CURRENT.get()
    return SymBool(term) if explorer is None else explorer.decide(term)


def _shift(k: Any, op: str) -> int:
    if isinstance(k, bool) or not isinstance(k, int):
        raise Unsupported(
            f"shifts by {'a symbolic value' if isinstance(k, Sym) else repr(k)} "
            f"({op}); only by a non-negative int"
        )
    if k < 0:
        raise Unsupported(f"shifts by a negative count ({op} {k})")
    return 1 << k


def _positive_divisor(d: IntLike, op: str) -> int:
    if isinstance(d, Sym):
        raise Unsupported(f"uses {op} by a symbolic value, which is not linear arithmetic")
    if isinstance(d, bool) or not isinstance(d, int):
        raise Unsupported(f"uses {op} by {d!r}; only positive int divisors are supported")
    if d <= 0:
        raise Unsupported(f"uses {op} by {d}; only positive divisors are supported")
    return d


#: every free symbolic input stays within [-LIMIT, LIMIT] (2^26 tokens is far beyond any real
#: KV pool); the bound also keeps the solver's branch-and-bound finite
LIMIT = 1 << 26


def num(v: int) -> z3.ArithRef:
    """A concrete value in the symbolic domain."""
    return z3.IntVal(v)


def int_var(name: str) -> z3.ArithRef:
    return z3.Int(name)


def in_range(x: z3.ArithRef) -> z3.BoolRef:
    return z3.And(x >= -LIMIT, x <= LIMIT)


@dataclass
class DivisionSink:
    """Where floor divisions by a constant become a fresh quotient ``q`` with
    ``d*q <= x < d*q + d``: plain linear facts, which z3 reasons about much faster than its
    ``div``. The facts are definitions, true on every path, so they are kept unguarded."""

    facts: list[z3.BoolRef] = field(default_factory=list)
    cache: dict[tuple[int, int], z3.ArithRef] = field(default_factory=dict)
    #: every quotient in the order it was made: ``(x, d, q)``
    quotients: list[tuple[z3.ArithRef, int, z3.ArithRef]] = field(default_factory=list)
    #: numbers the quotients in the order this sink (and its forks) made them: z3's FreshInt
    #: numbers across the whole process, so the same check's formula would differ between a
    #: first and a later run in one process, and so would z3's answer within a budget
    names: itertools.count = field(default_factory=itertools.count)

    def quotient(self, x: z3.ArithRef, d: int) -> z3.ArithRef:
        key = (x.get_id(), d)
        q = self.cache.get(key)
        if q is None:
            q = z3.Int(f"q#{next(self.names)}")
            self.facts += [d * q <= x, x < d * q + d]
            self.cache[key] = q
            self.quotients.append((x, d, q))
        return q


_DIVISIONS: contextvars.ContextVar[DivisionSink | None] = contextvars.ContextVar(
    "policykit_spec_divisions", default=None
)


def collect_divisions(sink: DivisionSink | None) -> contextvars.Token:
    """Route floor divisions into ``sink`` until the token is reset (``None``: z3 ``div``)."""
    return _DIVISIONS.set(sink)


def reset_divisions(token: contextvars.Token) -> None:
    _DIVISIONS.reset(token)


def quotient(x: z3.ArithRef, d: int) -> z3.ArithRef:
    """Python's ``x // d`` for a positive int ``d``."""
    x = z3.simplify(x)
    if z3.is_int_value(x):
        return num(x.as_long() // d)
    if d == 1:
        return x
    exact = exact_quotient(x, d)
    if exact is not None:
        return exact
    sink = _DIVISIONS.get()
    return x / d if sink is None else sink.quotient(x, d)


def as_int(x: Sym) -> int:
    """``x`` where code shared with the scheduler is annotated ``int`` (a view's fields, the
    ledger's budgets, the kernel's arguments): the checker runs that very code on symbols, and a
    :class:`Sym` does what an int does there or refuses (module docstring). Only the annotation
    differs, so this is a cast: nothing happens at run time."""
    return cast(int, x)


def as_sym(x: int) -> Sym:
    """The reverse of :func:`as_int`: a value the model put in as a :class:`Sym`, read back
    through an ``int`` annotation (the budgets of a ledger the model opened). A cast too."""
    return cast(Sym, x)


def term_of(x: int | None) -> z3.ArithRef:
    """The z3 term of a value the model put in as a :class:`Sym` and reads back through an
    ``int`` annotation (a ledger budget: :func:`as_sym`). ``None`` is the sliding-window
    baseline of a configuration without a window, which nothing reads: a bug if it is."""
    if x is None:
        raise AssertionError("a sliding-window budget read where there is no sliding window")
    return as_sym(x).t


class Sym:
    """A symbolic integer. Python semantics are kept: ``//`` and ``%`` by a positive int floor
    like Python's (z3's integer ``div``/``mod`` agree for positive divisors)."""

    __slots__ = ("t",)

    def __init__(self, term: z3.ArithRef) -> None:
        self.t = term

    # arithmetic ------------------------------------------------------------------------
    def __add__(self, o: IntLike) -> Sym:
        return Sym(self.t + _term(o))

    def __radd__(self, o: IntLike) -> Sym:
        return Sym(_term(o) + self.t)

    def __sub__(self, o: IntLike) -> Sym:
        return Sym(self.t - _term(o))

    def __rsub__(self, o: IntLike) -> Sym:
        return Sym(_term(o) - self.t)

    def __mul__(self, o: IntLike) -> Sym:
        if isinstance(o, Sym):
            raise Unsupported("multiplies two symbolic values, which is not linear arithmetic")
        return Sym(self.t * _term(o))

    __rmul__ = __mul__

    def __neg__(self) -> Sym:
        return Sym(-self.t)

    def __pos__(self) -> Sym:
        return self

    def __abs__(self) -> Sym:
        return Sym(z3.If(self.t < 0, -self.t, self.t))

    def __floordiv__(self, o: IntLike) -> Sym:
        return Sym(quotient(self.t, _positive_divisor(o, "//")))

    def __mod__(self, o: IntLike) -> Sym:
        d = _positive_divisor(o, "%")
        return Sym(self.t - d * quotient(self.t, d))

    def __rfloordiv__(self, o: IntLike) -> Sym:
        raise Unsupported("divides by a symbolic value, which is not linear arithmetic")

    __rmod__ = __rfloordiv__

    def __truediv__(self, o: Any) -> Ratio:
        if isinstance(o, Sym):
            raise Unsupported("divides by a symbolic value, which is not linear arithmetic")
        if isinstance(o, bool) or not isinstance(o, int) or o <= 0:
            raise Unsupported(
                f"uses true division '/' by {o!r}, which makes a float; only math.ceil or "
                "math.floor of an int divided by a positive int is exact (or use '//')"
            )
        return Ratio(self, o)

    def __rtruediv__(self, o: Any) -> Sym:
        raise Unsupported("divides by a symbolic value, which is not linear arithmetic")

    # comparisons -----------------------------------------------------------------------
    def __lt__(self, o: IntLike) -> Any:
        return _compare(self.t < _term(o))

    def __le__(self, o: IntLike) -> Any:
        return _compare(self.t <= _term(o))

    def __gt__(self, o: IntLike) -> Any:
        return _compare(self.t > _term(o))

    def __ge__(self, o: IntLike) -> Any:
        return _compare(self.t >= _term(o))

    def __eq__(self, o: object) -> Any:
        if o is None:
            return False  # an int never equals None
        return _compare(self.t == _term(o))

    def __ne__(self, o: object) -> Any:
        if o is None:
            return True
        return _compare(self.t != _term(o))

    def __hash__(self) -> int:
        raise Unsupported("hashes a symbolic value (a set, a dict key or hash())")

    # what a symbol cannot become -------------------------------------------------------
    def __int__(self) -> int:
        return _one_value(self.t, "a concrete int in int() (int(x) of an int is x: leave it out)")

    def __index__(self) -> int:
        return _one_value(self.t, "an index, a range bound or a repeat count")

    def __float__(self) -> float:
        raise Unsupported("converts a symbolic value to a float")

    def __bool__(self) -> bool:
        return bool(self != 0)

    def __complex__(self) -> complex:
        raise Unsupported("converts a symbolic value to a complex number")

    # exact on ints, and linear --------------------------------------------------------------
    def __invert__(self) -> Sym:
        return Sym(-self.t - 1)  # ~x == -x - 1 on Python ints

    def __lshift__(self, k: Any) -> Sym:
        return Sym(self.t * _shift(k, "<<"))

    def __rshift__(self, k: Any) -> Sym:
        return Sym(quotient(self.t, _shift(k, ">>")))

    def __divmod__(self, o: IntLike) -> tuple[Sym, Sym]:
        return self // o, self % o

    def __round__(self, ndigits: Any = None) -> Sym:
        if ndigits is not None:
            raise Unsupported("rounds a symbolic value to a number of digits")
        return self

    def __trunc__(self) -> Sym:
        return self

    __floor__ = __ceil__ = __trunc__

    # not linear, or not an int's meaning: refused -------------------------------------------
    # (a dunder name: the guard lets policy code call the evaluator's operators, nothing else)
    def __refused__(self, *_: Any) -> Any:
        raise Unsupported("uses a bitwise operator or a power on a symbolic value")

    __and__ = __rand__ = __or__ = __ror__ = __xor__ = __rxor__ = __refused__
    __pow__ = __rpow__ = __rlshift__ = __rrshift__ = __rdivmod__ = __refused__

    def __getattr__(self, name: str) -> Any:
        if name.startswith("__"):
            raise AttributeError(name)
        raise Unsupported(f"reads .{name} of a symbolic value (only int arithmetic is modelled)")

    def __format__(self, spec: str) -> str:
        raise Unsupported("formats a symbolic value as text")

    def __str__(self) -> str:
        if _CURRENT.get() is not None:
            raise Unsupported("turns a symbolic value into text")
        return repr(self)

    def __repr__(self) -> str:
        if _CURRENT.get() is not None:
            raise Unsupported("turns a symbolic value into text")
        return f"Sym({self.t})"


#: the most values a symbolic int may take where Python needs a concrete one (``range(n)``,
#: an index, ``int(n)``): each value becomes a path of its own
MAX_CONCRETE_VALUES = 64
#: z3 resource units to find those values' bounds on one path (a few linear facts)
BOUNDS_RLIMIT = 5_000_000


def _one_value(term: z3.ArithRef, use: str) -> int:
    """``term`` as a concrete int, for Python code that needs one: where the path that
    reaches here bounds it to at most :data:`MAX_CONCRETE_VALUES` values, the evaluation forks
    once per value (so ``range(n)`` runs ``n`` times on each path, exactly as Python does);
    anything else is refused."""
    explorer = _CURRENT.get()
    if explorer is None:
        raise Unsupported(f"uses a symbolic value as {use} outside a policy")
    bounds = Guard.suspended(lambda: _path_bounds(term, explorer.conds))
    if bounds is None:
        raise Unsupported(
            f"uses a symbolic value as {use}, and the path to it does not bound it to at most "
            f"{MAX_CONCRETE_VALUES} values (bound it first, e.g. `if 0 <= n <= 8:`)"
        )
    low, high = bounds
    for value in range(low, high):
        if explorer.decide(term == value):
            return value
    return high  # the path implies it: every smaller value was ruled out above


def _path_bounds(term: z3.ArithRef, conds: list[z3.BoolRef]) -> tuple[int, int] | None:
    """The least and greatest value of ``term`` on the path ``conds`` (with the definitions
    of the quotients they mention), or None when unbounded, too wide or not found in budget.
    An infeasible path gives ``(0, 0)``: whatever it returns is never used."""
    simple = z3.simplify(term)
    if z3.is_int_value(simple):
        return simple.as_long(), simple.as_long()
    opt = z3.Optimize()
    opt.set("rlimit", BOUNDS_RLIMIT)
    opt.set("priority", "box")
    opt.add(*conds, *_quotient_facts([term, *conds]))
    low, high = opt.minimize(term), opt.maximize(term)
    verdict = opt.check()
    if verdict == z3.unsat:
        return 0, 0
    if verdict != z3.sat:
        return None
    least, most = opt.lower(low), opt.upper(high)
    if not (z3.is_int_value(least) and z3.is_int_value(most)):
        return None
    least, most = least.as_long(), most.as_long()
    return (least, most) if most - least < MAX_CONCRETE_VALUES else None


def _quotient_facts(terms: list[z3.ExprRef]) -> list[z3.BoolRef]:
    """``d*q <= x < d*q + d`` for every quotient ``q`` the terms mention (and those its ``x``
    mentions in turn)."""
    sink = _DIVISIONS.get()
    if sink is None:
        return []
    defined = {q.get_id(): (x, d, q) for x, d, q in sink.quotients}
    facts: list[z3.BoolRef] = []
    seen: set[int] = set()
    todo = [v for t in terms for v in _free_ints(t)]
    while todo:
        v = todo.pop()
        if v.get_id() in seen or v.get_id() not in defined:
            continue
        seen.add(v.get_id())
        x, d, q = defined[v.get_id()]
        facts += [d * q <= x, x < d * q + d]
        todo.extend(_free_ints(x))
    return facts


#: ``a / b`` of ints is correctly rounded, so ``math.ceil`` and ``math.floor`` of it are the
#: integer ceiling and floor while ``|a| < 2**53``; beyond, the float rounds first
FLOAT_EXACT = 1 << 53


class Ratio:
    """``a / b`` of a symbolic int ``a`` and a positive int ``b``: a float in Python, exact
    here only through ``math.ceil`` and ``math.floor``; anything else done with it is refused
    (a comparison, arithmetic, ``int()``, ``round()``: float rounding the checker does not
    model)."""

    __slots__ = ("denominator", "numerator")

    def __init__(self, numerator: Sym, denominator: int) -> None:
        self.numerator, self.denominator = numerator, denominator

    def __ceil__(self) -> Sym:
        _require_float_exact(self.numerator.t)
        return -((-self.numerator) // self.denominator)

    def __floor__(self) -> Sym:
        _require_float_exact(self.numerator.t)
        return self.numerator // self.denominator

    def __refused__(self, *_: Any) -> Any:
        raise Unsupported(
            "uses true division '/' (a float) other than as math.ceil(a / b) or "
            "math.floor(a / b) of ints; use '//'"
        )

    __eq__ = __ne__ = __lt__ = __le__ = __gt__ = __ge__ = __bool__ = __hash__ = __refused__
    __int__ = __float__ = __index__ = __round__ = __trunc__ = __str__ = __format__ = __refused__
    __add__ = __radd__ = __sub__ = __rsub__ = __mul__ = __rmul__ = __neg__ = __pos__ = __refused__
    __truediv__ = __rtruediv__ = __floordiv__ = __rfloordiv__ = __mod__ = __abs__ = __refused__

    def __getattr__(self, name: str) -> Any:
        if name.startswith("__"):
            raise AttributeError(name)
        return self.__refused__()

    def __repr__(self) -> str:
        if _CURRENT.get() is not None:
            self.__refused__()
        return f"Ratio({self.numerator!r}, {self.denominator})"


def _require_float_exact(numerator: z3.ArithRef) -> None:
    """Refuse ``math.ceil(a / b)`` unless ``|a| < 2**53`` for every view in the checked range
    (each free input within ``±LIMIT``). Asked while a policy is lifted, on fresh variables;
    the model's own re-runs follow the lifted paths."""
    if _GUARD.get() is None:
        return
    Guard.suspended(lambda: _float_exact_or_refuse(numerator))


def _float_exact_or_refuse(numerator: z3.ArithRef) -> None:
    sink = _DIVISIONS.get()
    facts = list(sink.facts) if sink is not None else []
    quotients = {q.get_id() for _, _, q in sink.quotients} if sink is not None else set()
    inputs = {
        v.get_id(): v
        for term in (numerator, *facts)
        for v in _free_ints(term)
        if v.get_id() not in quotients
    }
    solver = z3.Solver()
    solver.set("rlimit", FLOAT_CHECK_RLIMIT)
    solver.add(*facts, *(in_range(v) for v in inputs.values()))
    solver.add(z3.Or(numerator >= FLOAT_EXACT, numerator <= -FLOAT_EXACT))
    if solver.check() != z3.unsat:
        raise Unsupported(
            "takes math.ceil or math.floor of a / b where a may reach 2**53, beyond which the "
            "float a / b is rounded before ceil or floor sees it; write -(-a // b) or a // b"
        )


#: z3 resource units for the 2**53 question above: a few linear facts, answered in far fewer
FLOAT_CHECK_RLIMIT = 2_000_000


def _free_ints(term: z3.ExprRef) -> list[z3.ArithRef]:
    """The integer constants (variables) a term mentions."""
    seen: set[int] = set()
    out: list[z3.ArithRef] = []
    stack = [term]
    while stack:
        e = stack.pop()
        if e.get_id() in seen:
            continue
        seen.add(e.get_id())
        if z3.is_const(e) and e.decl().kind() == z3.Z3_OP_UNINTERPRETED and z3.is_int(e):
            out.append(e)
        stack.extend(e.children())
    return out


class SymBool:
    """A symbolic truth value; asking for a Python bool forks the current evaluation."""

    __slots__ = ("t",)

    def __init__(self, term: z3.BoolRef) -> None:
        self.t = term

    def __bool__(self) -> bool:
        explorer = _CURRENT.get()
        if explorer is None:
            raise Unsupported("branches on a symbolic value outside a symbolic evaluation")
        return explorer.decide(self.t)

    def __and__(self, o: Any) -> SymBool:
        return SymBool(z3.And(self.t, _bool_term(o)))

    __rand__ = __and__

    def __or__(self, o: Any) -> SymBool:
        return SymBool(z3.Or(self.t, _bool_term(o)))

    __ror__ = __or__

    def __invert__(self) -> Sym:
        return Sym(-_term(self) - 1)  # a bool is an int: ~True == -2, ~False == -1

    def __eq__(self, o: object) -> Any:
        if isinstance(o, SymBool | bool):
            return _compare(self.t == _bool_term(o))
        return _compare(_term(self) == _term(o))

    def __ne__(self, o: object) -> Any:
        if isinstance(o, SymBool | bool):
            return _compare(self.t != _bool_term(o))
        return _compare(_term(self) != _term(o))

    def __hash__(self) -> int:
        raise Unsupported("hashes a symbolic truth value")

    def __repr__(self) -> str:
        return f"SymBool({self.t})"


def _bool_term(x: Any) -> z3.BoolRef:
    if isinstance(x, SymBool):
        return x.t
    if isinstance(x, bool):
        return z3.BoolVal(x)
    raise Unsupported(f"combines a symbolic truth value with {x!r}")


_CURRENT: contextvars.ContextVar[Explorer | None] = contextvars.ContextVar(
    "policykit_spec_explorer", default=None
)


class NonDeterministic(BaseException):
    """A policy took another branch when run again on the same input."""


_GUARD: contextvars.ContextVar[Guard | None] = contextvars.ContextVar(
    "policykit_spec_guard", default=None
)


@dataclass
class Explorer:
    """Depth-first walk over the branch decisions of one function."""

    prefix: list[bool] = field(default_factory=list)
    taken: list[bool] = field(default_factory=list)
    conds: list[z3.BoolRef] = field(default_factory=list)
    pending: list[list[bool]] = field(default_factory=list)

    def decide(self, cond: z3.BoolRef) -> bool:
        i = len(self.taken)
        simple = z3.simplify(cond)
        if z3.is_true(simple) or z3.is_false(simple):
            value = z3.is_true(simple)
            if i < len(self.prefix) and self.prefix[i] != value:
                raise NonDeterministic()
        elif i < len(self.prefix):
            value = self.prefix[i]
        else:
            value = True
            self.pending.append([*self.taken, False])
        self.taken.append(value)
        self.conds.append(cond if value else z3.Not(cond))
        return value


@dataclass(frozen=True)
class Outcomes:
    """Every path of one evaluation: (path condition, result)."""

    paths: tuple[tuple[z3.BoolRef, Any], ...]

    def merged(self) -> Any:
        """One value: a z3-backed Sym/SymBool for numbers and truths, or ``Choice`` for enums."""
        values = [v for _, v in self.paths]
        if all(isinstance(v, SymBool | bool) for v in values):
            return SymBool(self._fold([_bool_term(v) for v in values]))
        if all(isinstance(v, Sym | int) and not isinstance(v, bool) for v in values):
            return Sym(self._fold([_term(v) for v in values]))
        if all(isinstance(v, enum.Enum) for v in values):
            return Choice(
                {
                    v: z3.Or(*[c for c, w in self.paths if w is v])
                    for v in dict.fromkeys(values)  # keeps first-seen order
                }
            )
        raise Unsupported(f"returned values of mixed or unsupported types: {values!r}")

    def _fold(self, terms: list[Any]) -> Any:
        out = terms[-1]
        for (cond, _), term in zip(reversed(self.paths[:-1]), reversed(terms[:-1]), strict=True):
            out = z3.If(cond, term, out)
        return out


@dataclass(frozen=True)
class Choice:
    """A symbolic choice among concrete values (an enum verdict): value -> condition."""

    when: dict[Any, z3.BoolRef]

    def is_(self, value: Any) -> z3.BoolRef:
        return self.when.get(value, z3.BoolVal(False))


def explore(fn: Callable[[], Any]) -> Outcomes:
    """Run ``fn`` once per feasible branch combination and collect the paths.

    Exceptions raised by ``fn`` propagate unchanged (the caller names the culprit).
    """
    todo: list[list[bool]] = [[]]
    paths: list[tuple[z3.BoolRef, Any]] = []
    guard = _GUARD.get()
    while todo:
        prefix = todo.pop()
        ex = Explorer(prefix=prefix)
        token = _CURRENT.set(ex)
        try:
            if guard is None:
                result = fn()
            else:
                guard.start()
                try:
                    result = fn()
                finally:
                    guard.stop()
        finally:
            _CURRENT.reset(token)
        if len(ex.taken) < len(prefix):
            raise NonDeterministic()
        todo.extend(reversed(ex.pending))
        paths.append((z3.And(*ex.conds) if ex.conds else z3.BoolVal(True), result))
        if len(paths) > MAX_PATHS:
            raise Unsupported(f"takes more than {MAX_PATHS} paths (a loop on a symbolic value?)")
    return Outcomes(tuple(paths))


def _policy_frame(exc: BaseException, policy: object) -> str:
    """``file:line`` of the deepest frame outside this module: where the policy (or a helper
    it called) did the unsupported thing; the policy's own module is preferred."""
    frames = traceback.extract_tb(exc.__traceback__)
    here = Path(__file__).resolve()
    own = own_files(policy)
    outside = [f for f in frames if Path(f.filename).resolve() != here and "z3" not in f.filename]
    in_policy = [f for f in outside if str(Path(f.filename).resolve()) in own]
    frame = (in_policy or outside or frames)[-1]
    where = f"{frame.filename}:{frame.lineno} (in {frame.name})"
    if in_policy and outside and outside[-1] is not frame:
        inner = outside[-1]
        where += f", inside {inner.name}() at {inner.filename}:{inner.lineno}"
    return where


def _merged(outcome: Outcomes, fn: Any, who: str, method: str) -> Any:
    """The paths' results as one value. Values no term can hold (a str, a float, a bool on one
    path and an int on another) are the method's answer, not any one operation's, so the error
    names the method where it is defined: the frame that is running when they meet is the
    checker's caller (a CLI helper, a worker's ``<string>``), which would point nowhere useful.
    """
    token = _GUARD.set(None)
    try:
        return outcome.merged()
    except Unsupported as exc:
        raise SymbolicEvaluationError(
            f"{who} cannot be checked: its {method}() {exc}, in {defined_at(fn)}. The checker "
            "vouches only for a pure function of the view written with int arithmetic, "
            "comparisons, min/max and if (see 'What the checker trusts' in docs/spec.md)."
        ) from None
    finally:
        _GUARD.reset(token)


def refused_who(policy: Any, source: str, method: str | None = None) -> str:
    """Who a refusal is about: the policy, its distribution (``source``), its module, and with
    ``method`` the file and line that define it, so a third-party plugin's author is sent to
    their own code whichever check refused it (the construct's own line follows in the
    reason where there is one)."""
    who = f"The {policy.kind} policy {policy.spec!r} ({source}), module {type(policy).__module__}"
    if method is None:
        return who
    return f"{who}, {method}() at {defined_at(getattr(policy, method))},"


def run_guarded(
    policy: Any, method: str, view: Any, *, source: str = "built-in"
) -> tuple[Any, list[z3.BoolRef], Guard]:
    """Run ``policy.method(view)`` on symbolic values under a :class:`Guard`, once per branch
    combination: the paths merged into one value, each path's condition, and the guard (what
    module-level values the code read, which cached helpers it ran uncached).

    ``source`` names where the policy came from (a plugin distribution), for the error.
    """
    fn = getattr(policy, method)
    who = refused_who(policy, source, method)
    guard = Guard(owner=policy, symbolic=True)
    token = _GUARD.set(guard)
    try:
        outcome = explore(lambda: fn(view))
        if guard.violation is None:
            return _merged(outcome, fn, who, method), [c for c, _ in outcome.paths], guard
    except (Unsupported, Breach) as exc:
        if guard.violation is None:
            raise SymbolicEvaluationError(
                f"{who} cannot be checked symbolically: its {method}() {exc} at "
                f"{_policy_frame(exc, policy)}. Policies must use int arithmetic (+ - * // % by "
                "a positive int), comparisons, min/max and if."
            ) from None
    except NonDeterministic:
        raise SymbolicEvaluationError(
            f"{who} is not deterministic: its {method}() took different branches when run "
            "again on the same input. Policies must be pure functions of their view."
        ) from None
    except PolicykitError:
        raise
    except Exception as exc:
        if guard.violation is None:
            raise SymbolicEvaluationError(
                f"{who} raised {type(exc).__name__}: {exc} during symbolic evaluation of "
                f"{method}() at {_policy_frame(exc, policy)}."
            ) from None
    finally:
        _GUARD.reset(token)
    raise SymbolicEvaluationError(
        f"{who} cannot be checked: its {method}() {guard.violation}. The checker vouches only "
        "for a pure function of the view written with int arithmetic, comparisons, min/max and "
        "if (see 'What the checker trusts' in docs/spec.md)."
    )


def decide_all(fn: Callable[[], Any]) -> Any:
    """Evaluate core code (not a policy) that branches on symbols, e.g. ``Ledger.budget_state``."""
    return explore(fn).merged()
