"""The kernel's number domain on z3 terms, and the encoder that names its values.

:mod:`policykit.kernel` decides a round over a number domain; :class:`Terms` is that domain on
z3 terms (:class:`~policykit.kernel.Ints` is the planner's, on ints). Every answer it gets is
bound to a fresh name by an :class:`Encoder`, whose side facts (``v == term``) keep the
unrolled formulas small, and a broken answer is a condition (the ``contract`` property), not an
exception. Both checker models (:mod:`.model` and :mod:`.bmc` for SGLang's node,
:mod:`.preempting_bmc` for the node that preempts) build their formulas with these; neither is
a model itself.
"""

from __future__ import annotations

import dataclasses
import itertools
from dataclasses import dataclass, field
from typing import Any

import z3

from policykit.ledger import Ledger
from policykit.policy import AdmitView
from policykit.registry import Combo
from policykit.spec.lifted import evaluate
from policykit.spec.symbolic import (
    DivisionSink,
    Sym,
    SymBool,
    collect_divisions,
    in_range,
    int_var,
    num,
    reset_divisions,
)

#: the ledger's fields a model carries as terms (:func:`ledger_fields`)
_LEDGER_FIELDS = (
    "baseline",
    "rem_total_token_offset",
    "cur_rem_token_offset",
    "rem_swa_token_offset",
    "rem_chunk_tokens",
    "rem_input_tokens",
    "swa_baseline",  # a load-back's sliding-window KV lowers it (``kernel.load_back_swa``)
)


def t(x: Any) -> Any:
    """The z3 term of an int, Sym or SymBool."""
    if isinstance(x, z3.ExprRef):
        return x
    if isinstance(x, Sym | SymBool):
        return x.t
    return z3.BoolVal(x) if isinstance(x, bool) else num(x)


def ite(c: Any, a: Any, b: Any) -> Sym:
    return Sym(z3.If(t(c), t(a), t(b)))


def value(m: z3.ModelRef, x: Any) -> Any:
    """``x``'s value in the model ``m``: a Python bool or int (an input the formula leaves free
    gets z3's default)."""
    v = m.eval(t(x), model_completion=True)
    return z3.is_true(v) if z3.is_bool(v) else v.as_long()


@dataclass
class Encoder:
    """Fresh names and side facts (``v == term``) that keep formulas small."""

    facts: list[z3.BoolRef] = field(default_factory=list)
    counter: itertools.count = field(default_factory=itertools.count)

    _token: Any = None

    def __post_init__(self) -> None:
        self.divisions = DivisionSink(facts=self.facts)

    def __enter__(self) -> Encoder:
        """While open, floor divisions become linear facts of this encoder."""
        self._token = collect_divisions(self.divisions)
        return self

    def __exit__(self, *exc: object) -> None:
        reset_divisions(self._token)

    def fork(self) -> Encoder:
        """A copy of the facts made so far, to ask one more question about them; names stay
        unique across copies (one counter), so a copy can go on making terms. The copy reuses
        the quotients already made: a second quotient of the same term is a fact z3 must
        rediscover (measured: the induction of every built-in combo took 20-25 s instead of
        15 s that way)."""
        fork = Encoder(facts=list(self.facts), counter=self.counter)
        fork.divisions.cache = dict(self.divisions.cache)
        fork.divisions.quotients = list(self.divisions.quotients)
        fork.divisions.names = self.divisions.names
        return fork

    def var(self, name: str) -> Sym:
        """A free symbolic integer, kept within the no-wrap-around range."""
        v = int_var(f"{name}!{next(self.counter)}")
        self.facts.append(in_range(v))
        return Sym(v)

    def name(self, name: str) -> Sym:
        """A symbolic integer that is only ever bound to a term (no range fact needed)."""
        return Sym(int_var(f"{name}!{next(self.counter)}"))

    def bool(self, name: str) -> z3.BoolRef:
        return z3.Bool(f"{name}!{next(self.counter)}")

    def bind(self, name: str, value: Any) -> Sym:
        """A fresh variable equal to ``value`` (a Sym or int)."""
        v = self.name(name)
        self.facts.append(v.t == t(value))
        return v

    def bind_bool(self, name: str, value: Any) -> z3.BoolRef:
        b = self.bool(name)
        self.facts.append(b == t(value))
        return b


def truth(x: Any) -> z3.BoolRef:
    """The z3 term of a truth value (a ``SymBool``, a z3 term or a Python bool)."""
    if isinstance(x, SymBool):
        return x.t
    return z3.BoolVal(x) if isinstance(x, bool) else x


class Terms:
    """The z3 domain of :mod:`policykit.kernel`: every answer is a named term, a broken one a
    condition (the ``contract`` property), and every branch is built (``when``)."""

    def __init__(self, enc: Encoder, combo: Combo, sources: dict[str, str]) -> None:
        self.enc, self.combo, self.sources = enc, combo, sources

    def ask(self, kind: str, method: str, view: Any) -> Any:
        """The ``kind`` policy's ``method(view)``, evaluated symbolically."""
        policy = getattr(self.combo, kind)
        return evaluate(policy, method, view, source=self.sources.get(kind, "built-in"))

    def all(self, *conds: Any) -> z3.BoolRef:
        return z3.And(*(truth(c) for c in conds))

    def any(self, *conds: Any) -> z3.BoolRef:
        return z3.Or(*(truth(c) for c in conds))

    def not_(self, cond: Any) -> z3.BoolRef:
        return z3.Not(truth(cond))

    def choose(self, cond: Any, a: Any, b: Any) -> Any:
        """``a`` where ``cond`` holds, else ``b``: numbers, truth values, and ledgers and the
        kernel's records field by field."""
        if a is None and b is None:  # a field neither side has (``Offer.swa_load_lock``)
            return None
        if isinstance(a, Ledger):
            return pick_ledger(truth(cond), a, b)
        if dataclasses.is_dataclass(a) and not isinstance(a, type):
            picked = {
                f.name: self.choose(cond, getattr(a, f.name), getattr(b, f.name))
                for f in dataclasses.fields(a)
            }
            return type(a)(**picked)
        if isinstance(a, Sym) or isinstance(b, Sym):  # (an offer's window lock may be 0)
            return ite(cond, a, b)
        return z3.If(truth(cond), truth(a), truth(b))

    def decide(
        self,
        kind: str,
        method: str,
        view: Any,
        request_id: str,
        *,
        label: str,
        bad: Any,
        complaint: Any,
    ) -> tuple[Sym, z3.BoolRef]:
        answer = self.enc.bind(label, self.ask(kind, method, view))
        return answer, truth(bad(answer))

    def admits(self, view: AdmitView, request_id: str, *, label: str = "admit") -> z3.BoolRef:
        return self.enc.bind_bool(label, self.ask("admission", "admit", view))

    def when(self, cond: Any, work: Any) -> Any:
        return work()

    def name(self, label: str, value: Any) -> Any:
        if isinstance(value, Sym):
            return self.enc.bind(label, value)
        return self.enc.bind_bool(label, truth(value))

    def known_zero(self, x: Any) -> bool:
        return is_zero(x)


def is_zero(x: Sym) -> bool:
    """Whether ``x`` is the constant 0 (a request with no unpinned prefix: no lock to model)."""
    term = z3.simplify(t(x))
    return z3.is_int_value(term) and term.as_long() == 0


def pick_ledger(cond: z3.BoolRef, a: Ledger, b: Ledger) -> Ledger:
    """Ledger ``a`` where ``cond`` holds, else ``b`` (field by field)."""
    out = dataclasses.replace(a)
    for name in ledger_fields(a):
        setattr(out, name, ite(cond, getattr(a, name), getattr(b, name)))
    return out


def ledger_fields(ledger: Ledger) -> tuple[str, ...]:
    """The ledger's symbolic fields (no input budget, no sliding-window baseline where the
    configuration has none)."""
    return tuple(n for n in _LEDGER_FIELDS if getattr(ledger, n) is not None)
