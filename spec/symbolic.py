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
``int(n)``, a shift count) when the path bounds it to a few values: the evaluation forks once
per value.

Loops on symbolic values (``while x > page: x //= 2``) fork once per trip. While a policy is
lifted, a branch taken again at one place on one path (a trip) is first asked of z3: a side no
view in the checked range can take is not followed, so the loop ends where Python's would for
every such view (:class:`Explorer`). A loop whose bound that does not show is refused after
:data:`MAX_LOOP_DECISIONS` trips, and every evaluation has a budget of paths, z3 units and
time, so a policy is always either lifted or refused, quickly.

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
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from types import FrameType
from typing import Any, cast

import z3

from policykit.errors import PolicykitError
from policykit.policy import defined_at
from policykit.spec.bitwise import masked
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


def _unwatched(work: Callable[[], Any]) -> Any:
    """The checker's own z3 work in the middle of a watched policy call, with the guard's
    hooks off: they see every call of z3's Python API, and made a loop's lifting ten times
    slower (the guard still watches every line of the policy's own code)."""
    return work() if sys.gettrace() is None else Guard.suspended(work)


def _shift_count(k: Any, op: str) -> int:
    """A shift's count as an int: a symbolic count the path bounds to a few values forks once
    per value (:func:`_one_value`), as ``range(n)`` does; a negative one raises as in Python."""
    if isinstance(k, Sym):
        k = _one_value(k.t, f"a shift count ({op})")
    if not isinstance(k, int):
        raise Unsupported(f"shifts by {k!r} ({op}); only by a non-negative int")
    if k < 0:
        raise ValueError("negative shift count")
    return int(k)


def _shift(k: Any, op: str) -> int:
    """``2**k``: shifting by a constant is multiplying or floor-dividing by a power of two."""
    return 1 << _shift_count(k, op)


def _divisor(d: IntLike, op: str) -> int:
    """A non-zero int divisor (a negative one floors as Python does: ``-(a // -b)`` is
    vLLM's ``cdiv``)."""
    if isinstance(d, Sym):
        raise Unsupported(f"uses {op} by a symbolic value, which is not linear arithmetic")
    if not isinstance(d, int):
        raise Unsupported(f"uses {op} by {d!r}; only non-zero int divisors are supported")
    if d == 0:
        raise Unsupported(f"uses {op} by 0 (Python raises ZeroDivisionError)")
    return int(d)


def _floor_div(x: z3.ArithRef, d: int) -> z3.ArithRef:
    """Python's ``x // d`` for a non-zero int ``d``: ``floor(x / d) == (-x) // -d``."""
    return quotient(x, d) if d > 0 else quotient(-x, -d)


def _int_operand(c: Any, op: str) -> int:
    """The constant on the left of ``c << x`` or ``c >> x``."""
    if not isinstance(c, int):
        raise Unsupported(f"shifts {c!r} ({op}) by a symbolic count; only an int")
    return int(c)


def _bitwise(x: Sym, m: Any, op: str) -> Sym:
    """``x & m``, ``x | m`` or ``x ^ m`` where that is linear (:mod:`policykit.spec.bitwise`):
    ``m`` a constant ``2**k - 1`` or ``-2**k``; anything else is refused, naming the mask."""
    if isinstance(m, Sym):
        raise Unsupported(
            f"uses '{op}' between two symbolic values, which is not linear arithmetic (only "
            "x & (2**k - 1), x & -2**k and their | and ^ with a constant k are)"
        )
    if not isinstance(m, int):
        raise Unsupported(f"uses '{op}' on a symbolic value and {m!r}; only an int mask")
    term = masked(op, x.t, int(m), lambda k: x.t - (1 << k) * quotient(x.t, 1 << k))
    if term is None:
        raise Unsupported(
            f"uses '{op}' with the mask {m}, which is not linear arithmetic: only 2**k - 1 and "
            "-2**k are (x & (page - 1), x & ~(page - 1) for a power-of-two page)"
        )
    return Sym(term)


#: the widest ``bit_length()`` followed: far past the range every input is checked in
MAX_BITS = 64

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
    return cast(z3.ArithRef, _unwatched(lambda: _quotient(x, d)))


def _quotient(x: z3.ArithRef, d: int) -> z3.ArithRef:
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
    """A symbolic integer. Python semantics are kept: ``//`` and ``%`` by a non-zero int floor
    like Python's (z3's integer ``div``/``mod`` agree for positive divisors; a negative one
    divides ``-x`` by ``-d``)."""

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
        return Sym(_floor_div(self.t, _divisor(o, "//")))

    def __mod__(self, o: IntLike) -> Sym:
        d = _divisor(o, "%")
        return Sym(self.t - d * _floor_div(self.t, d))

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

    def __rlshift__(self, c: Any) -> Any:
        return _int_operand(c, "<<") << _shift_count(self, "<<")

    def __rrshift__(self, c: Any) -> Any:
        return _int_operand(c, ">>") >> _shift_count(self, ">>")

    def __and__(self, m: Any) -> Sym:
        return _bitwise(self, m, "&")

    def __or__(self, m: Any) -> Sym:
        return _bitwise(self, m, "|")

    def __xor__(self, m: Any) -> Sym:
        return _bitwise(self, m, "^")

    __rand__, __ror__, __rxor__ = __and__, __or__, __xor__

    def __bit_length__(self) -> int:
        """``int.bit_length``: forks on ``|x| < 2**n`` for n = 0, 1, ... (the path's own
        range ends the chain: see :meth:`Explorer.decide`), each path a concrete int."""
        explorer = _CURRENT.get()
        if explorer is None:
            raise Unsupported("reads .bit_length() of a symbolic value outside a policy")
        size = z3.If(self.t < 0, -self.t, self.t)
        for n in range(MAX_BITS + 1):
            if explorer.decide(size < (1 << n)):
                return n
        raise Unsupported(f"reads .bit_length() of a value the path lets pass 2**{MAX_BITS}")

    # a dunder name: the guard lets policy code call the evaluator's operators, nothing else
    bit_length = __bit_length__

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
        raise Unsupported("uses a power on a symbolic value, which is not linear arithmetic")

    __pow__ = __rpow__ = __rdivmod__ = __refused__

    def __getattr__(self, name: str) -> Any:
        if name.startswith("__"):
            raise AttributeError(name)
        raise Unsupported(
            f"reads .{name} of a symbolic value (only int arithmetic and .bit_length() are "
            "modelled)"
        )

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


#: times one place in a policy may branch on a symbolic value on one path. A loop whose bound
#: the checker sees ends far sooner (halving a value of the checked range: 27 times; a count
#: bounded like ``range(n)``: 64); one it cannot see (``while need < tokens: need += page``)
#: is refused here, in well under a second, instead of running into the time limit
MAX_LOOP_DECISIONS = 128
#: z3 resource units to ask whether one side of a loop's branch is possible on its path (a few
#: linear facts; such a question takes thousands)
SIDES_RLIMIT = 1_000_000
#: z3 resource units such questions may take over all the paths of one evaluation (seconds)
SIDES_BUDGET = 100_000_000
#: seconds one watched evaluation may take over all its paths (each path has the guard's own
#: limit): with at most :data:`MAX_PATHS` paths, a method never holds a check up for long
EXPLORE_LIMIT_S = 30.0

Place = tuple[tuple[Any, int], ...]  #: policy frames' (code, instruction), innermost first


class Infeasible(BaseException):
    """No view in the checked range takes the path so far: it is dropped, not merged."""


@dataclass
class Effort:
    """What one evaluation has spent over all its paths, so that it ends with a refusal that
    names the busiest place rather than running on."""

    #: z3 resource units the questions about loops took
    spent: int = 0
    #: branches left open for a later path, per place
    forks: dict[Place, int] = field(default_factory=dict)

    def busiest(self) -> str:
        """`` (most of them at file:line)``, or nothing where no place was counted."""
        if not self.forks:
            return ""
        code, lasti = max(self.forks.items(), key=lambda item: item[1])[0][0]
        line = next((n for a, b, n in code.co_lines() if a <= lasti < b), code.co_firstlineno)
        return f" (most of them at {code.co_filename}:{line})"


@dataclass
class Explorer:
    """Depth-first walk over the branch decisions of one function.

    With ``loops``, each branch of policy code is counted by its place (the policy's frames
    and their instructions): past :data:`MAX_LOOP_DECISIONS` at one place on one path the
    policy is refused as a loop whose bound the checker cannot see. With ``prune`` (lifting,
    on fresh variables) a branch taken again at a place already decided on this path, that
    is a loop, is asked of z3 first: a side no view in the checked range (every input within
    ``±LIMIT``) can take is not followed. That is what ends a ``while`` loop on a symbolic
    value: ``while x > page: x //= 2`` stops where the range does, not never."""

    prefix: list[bool] = field(default_factory=list)
    taken: list[bool] = field(default_factory=list)
    conds: list[z3.BoolRef] = field(default_factory=list)
    pending: list[list[bool]] = field(default_factory=list)
    loops: bool = False
    prune: bool = False
    #: what every view guarantees (``policykit.spec.views``), assumed when pruning
    assume: tuple[z3.BoolRef, ...] = ()
    effort: Effort = field(default_factory=Effort)
    #: a side was left out as impossible (the lifted function then holds in the range only)
    cut: bool = False
    visits: dict[Place, int] = field(default_factory=dict)
    facts: PathFacts | None = None

    def decide(self, cond: z3.BoolRef) -> bool:
        """The side of ``cond`` this path takes (queueing the other where both are open)."""
        return cast(bool, _unwatched(lambda: self._decide(cond)))

    def _decide(self, cond: z3.BoolRef) -> bool:
        i = len(self.taken)
        simple = z3.simplify(cond)
        if z3.is_true(simple) or z3.is_false(simple):
            value = z3.is_true(simple)
            if i < len(self.prefix) and self.prefix[i] != value:
                raise NonDeterministic()
        else:
            place = _place() if self.loops else ()
            again = self.loops and self._visit(place)
            if i < len(self.prefix):
                value = self.prefix[i]
            else:
                value = self._new_branch(cond, again and self.prune, place)
        self.taken.append(value)
        self.conds.append(cond if value else z3.Not(cond))
        return value

    def infeasible(self) -> bool:
        """No view in the checked range takes this path (a branch taken at a place for the
        first time is not asked: ``if n < 1: ...`` then ``n.bit_length()`` may go on into
        ``n == 0``, where Python never gets)."""
        facts = PathFacts(self.assume)
        return cast(bool, _unwatched(lambda: facts.empty(self.conds)))

    def _visit(self, place: Place) -> bool:
        """Count a branch at ``place``; True when the path has branched there before."""
        count = self.visits[place] = self.visits.get(place, 0) + 1
        if count > MAX_LOOP_DECISIONS:
            raise Unsupported(
                f"branches on a symbolic value at one place more than {MAX_LOOP_DECISIONS} "
                "times on one path: a loop whose bound the checker cannot see (bound what it "
                "counts first, e.g. `if n > 64: return False`, or compute it without a loop, "
                "e.g. -(-a // b))"
            )
        return count > 1

    def _new_branch(self, cond: z3.BoolRef, ask: bool, place: Place) -> bool:
        """The side to follow first; the other is queued unless z3 rules it out."""
        if ask:
            if self.effort.spent > SIDES_BUDGET:
                raise Unsupported(
                    f"takes more than {SIDES_BUDGET:,} z3 units deciding where its loops on "
                    "symbolic values end (a loop whose bound the checker cannot see)"
                )
            if self.facts is None:
                self.facts = PathFacts(self.assume)
            yes, no = self.facts.sides(self.conds, cond, self.effort)
            if not (yes or no):
                raise Infeasible()
            if not (yes and no):
                self.cut = True
                return yes
        self.effort.forks[place] = self.effort.forks.get(place, 0) + 1
        self.pending.append([*self.taken, False])
        return True


def _place() -> Place:
    """Where policy code branches: its frames' code and instruction, innermost first, up to
    the evaluation (a loop's condition is the same place on every trip; a helper called from
    two lines is two places)."""
    out: list[tuple[Any, int]] = []
    frame: FrameType | None = sys._getframe(2)
    while frame is not None and frame.f_code is not _EXPLORE_CODE:
        if not trusted(frame.f_code):
            out.append((frame.f_code, frame.f_lasti))
        frame = frame.f_back
    return tuple(out)


class PathFacts:
    """One path's facts in one incremental solver, to ask which side of a loop's branch a view
    can take: what every view guarantees, the path's decisions so far, the definition of each
    quotient they mention and the range of each input (every free integer that is not a
    quotient is a field of the view, within ``±LIMIT``)."""

    def __init__(self, assume: tuple[z3.BoolRef, ...]) -> None:
        self.solver = z3.Solver()
        self.solver.set("rlimit", SIDES_RLIMIT)
        self.known: set[int] = set()
        self.added = 0
        self._add(list(assume))

    def sides(self, conds: list[z3.BoolRef], cond: z3.BoolRef, effort: Effort) -> tuple[bool, bool]:
        """Whether some view takes ``cond`` after ``conds``, and whether one takes its
        negation (undecided within budget: possible); what z3 spent is added to ``effort``."""
        self._add(conds[self.added :])
        self.added = len(conds)
        self._define([cond])
        before = self._spent()
        yes = self.solver.check(cond) != z3.unsat
        no = self.solver.check(z3.Not(cond)) != z3.unsat
        effort.spent += self._spent() - before
        return yes, no

    def _spent(self) -> int:
        try:
            return int(self.solver.statistics().get_key_value("rlimit count"))
        except z3.Z3Exception:  # nothing ran (the preprocessing alone answered)
            return 0

    def empty(self, conds: list[z3.BoolRef]) -> bool:
        """Whether no view takes the path ``conds`` at all (undecided: it may)."""
        self._add(conds[self.added :])
        self.added = len(conds)
        return self.solver.check() == z3.unsat

    def _add(self, facts: list[z3.BoolRef]) -> None:
        self._define(facts)
        self.solver.add(*facts)

    def _define(self, terms: list[z3.BoolRef]) -> None:
        sink = _DIVISIONS.get()
        defined = {q.get_id(): (x, d) for x, d, q in sink.quotients} if sink is not None else {}
        todo = [v for term in terms for v in _free_ints(term)]
        while todo:
            v = todo.pop()
            if v.get_id() in self.known:
                continue
            self.known.add(v.get_id())
            if v.get_id() in defined:
                x, d = defined[v.get_id()]
                self.solver.add(d * v <= x, x < d * v + d)
                todo.extend(_free_ints(x))
            else:
                self.solver.add(in_range(v))


@dataclass(frozen=True)
class Outcomes:
    """Every path of one evaluation: (path condition, result)."""

    paths: tuple[tuple[z3.BoolRef, Any], ...]
    #: a loop's side was left out as impossible in the checked range (see :class:`Explorer`)
    cut: bool = False

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


def explore(
    fn: Callable[[], Any],
    *,
    loops: bool = False,
    prune: bool = False,
    assume: tuple[z3.BoolRef, ...] = (),
) -> Outcomes:
    """Run ``fn`` once per feasible branch combination and collect the paths.

    ``loops`` counts a policy's branches by place, ``prune`` asks z3 which side of a loop's
    branch is possible for a view in the checked range that satisfies ``assume`` (see
    :class:`Explorer`). Exceptions raised by ``fn`` propagate unchanged (the caller names the
    culprit).
    """
    todo: list[list[bool]] = [[]]
    paths: list[tuple[z3.BoolRef, Any]] = []
    effort, cut = Effort(), False
    started = time.perf_counter()
    while todo:
        ex = Explorer(todo.pop(), loops=loops, prune=prune, assume=assume, effort=effort)
        try:
            result = _run_path(ex, fn)
        except Infeasible:
            todo.extend(reversed(ex.pending))
            continue
        except Exception:
            if not (prune and ex.infeasible()):
                raise
            todo.extend(reversed(ex.pending))  # Python raises on no view in the range
            continue
        todo.extend(reversed(ex.pending))
        cut = cut or ex.cut
        paths.append((z3.And(*ex.conds) if ex.conds else z3.BoolVal(True), result))
        _within_limits(len(paths), effort, started)
    if not paths:
        raise Unsupported("takes no path any view in the checked range takes")
    return Outcomes(tuple(paths), cut)


def _within_limits(paths: int, effort: Effort, started: float) -> None:
    """Refuse an evaluation past :data:`MAX_PATHS` paths or, watched, past
    :data:`EXPLORE_LIMIT_S` seconds in all: every policy gets a verdict or a refusal."""
    if paths > MAX_PATHS:
        raise Unsupported(
            f"takes more than {MAX_PATHS} paths{effort.busiest()}: a loop on a symbolic value, "
            "or more branches than the checker follows"
        )
    if _GUARD.get() is not None and time.perf_counter() - started > EXPLORE_LIMIT_S:
        raise Unsupported(
            f"takes more than {EXPLORE_LIMIT_S:g} s over its {paths} paths{effort.busiest()}"
        )


def _run_path(ex: Explorer, fn: Callable[[], Any]) -> Any:
    """``fn()`` along ``ex``'s decisions, watched by the active guard if there is one."""
    guard = _GUARD.get()
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
    if len(ex.taken) < len(ex.prefix):
        raise NonDeterministic()
    return result


_EXPLORE_CODE = explore.__code__


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
            "comparisons, min/max, if and loops with a bound it can see (see 'What the checker "
            "trusts' in docs/spec.md)."
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
    policy: Any,
    method: str,
    view: Any,
    *,
    source: str = "built-in",
    assume: tuple[z3.BoolRef, ...] = (),
) -> tuple[Any, list[z3.BoolRef], Guard, bool]:
    """Run ``policy.method(view)`` on symbolic values under a :class:`Guard`, once per branch
    combination: the paths merged into one value, each path's condition, the guard (what
    module-level values the code read, which cached helpers it ran uncached), and whether a
    loop's side was left out as impossible in the checked range (:class:`Explorer`).

    ``source`` names where the policy came from (a plugin distribution), for the error;
    ``assume`` is what the scheduler guarantees of the view, for loops (:class:`Explorer`).
    """
    fn = getattr(policy, method)
    who = refused_who(policy, source, method)
    guard = Guard(owner=policy, symbolic=True)
    token = _GUARD.set(guard)
    try:
        outcome = explore(lambda: fn(view), loops=True, prune=True, assume=assume)
        if guard.violation is None:
            merged = _merged(outcome, fn, who, method)
            return merged, [c for c, _ in outcome.paths], guard, outcome.cut
    except (Unsupported, Breach) as exc:
        if guard.violation is None:
            raise SymbolicEvaluationError(
                f"{who} cannot be checked symbolically: its {method}() {exc} at "
                f"{_policy_frame(exc, policy)}. Policies must use int arithmetic (+ - * // % by "
                "an int, shifts, page masks), comparisons, min/max, if and bounded loops."
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
        "for a pure function of the view written with int arithmetic, comparisons, min/max, if "
        "and loops with a bound it can see (see 'What the checker trusts' in docs/spec.md)."
    )


def decide_all(fn: Callable[[], Any]) -> Any:
    """Evaluate core code (not a policy) that branches on symbols, e.g. ``Ledger.budget_state``."""
    return explore(fn).merged()
