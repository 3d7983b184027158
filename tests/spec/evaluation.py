"""Evaluating the checker's formula on concrete inputs, as compiled Python.

The encoding of a round (``policykit.spec.bmc``) is a list of facts, nearly all of them
definitions ``v == term`` made in order, plus floor-division quotients defined by
``d*q <= x < d*q + d``. Given every input, those definitions determine every other variable.
:class:`Program` turns the facts into one straight-line Python function once (each shared
subterm computed once), so that evaluating a scenario costs microseconds per term instead of a
solver call; the function then checks that the values satisfy *every* fact, so what it returns
is a model of the very formula the checker solves. (It walks the terms with z3's C API: the
Python wrappers cost seconds per encoding.)
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

import z3
from z3 import z3core as C

_BINARY = {
    z3.Z3_OP_LE: "<=",
    z3.Z3_OP_LT: "<",
    z3.Z3_OP_GE: ">=",
    z3.Z3_OP_GT: ">",
    z3.Z3_OP_EQ: "==",
    z3.Z3_OP_IDIV: "//",
    z3.Z3_OP_MOD: "%",
    z3.Z3_OP_IMPLIES: "<=",  # on bools: a implies b is a <= b
}
_NARY = {
    z3.Z3_OP_ADD: " + ",
    z3.Z3_OP_SUB: " - ",
    z3.Z3_OP_MUL: " * ",
    z3.Z3_OP_AND: " and ",
    z3.Z3_OP_OR: " or ",
}


class Program:
    """The facts of one formula as a Python function of its inputs."""

    def __init__(self, facts: Iterable[z3.BoolRef], inputs: Iterable[z3.ExprRef]) -> None:
        self.ctx = z3.main_ctx().ref()
        self.slots: dict[str, int] = {}
        self.lines: list[str] = []
        self.memo: dict[int, str] = {}
        for x in inputs:
            self._slot(self._name(x.as_ast()))
        self.facts = list(facts)
        raw = [f.as_ast() for f in self.facts]
        for f in raw:
            self._define(f)
        checks = [self._expr(f) for f in raw]
        self.lines.append(f"return [i for i, ok in enumerate(({', '.join(checks)},)) if not ok]")
        self._run: Callable[[list], list[int]] = _compile("run", self.lines)

    # -- the C API, by raw ast ----------------------------------------------------------------
    def _kind(self, a: Any) -> int:
        """The decl kind of an application (``-1`` for a numeral)."""
        if C.Z3_get_ast_kind(self.ctx, a) == z3.Z3_NUMERAL_AST:
            return -1
        return C.Z3_get_decl_kind(self.ctx, C.Z3_get_app_decl(self.ctx, a))

    def _args(self, a: Any) -> list[Any]:
        return [C.Z3_get_app_arg(self.ctx, a, i) for i in range(C.Z3_get_app_num_args(self.ctx, a))]

    def _name(self, a: Any) -> str:
        decl = C.Z3_get_app_decl(self.ctx, a)
        return C.Z3_get_symbol_string(self.ctx, C.Z3_get_decl_name(self.ctx, decl))

    def _slot(self, name: str) -> int:
        return self.slots.setdefault(name, len(self.slots))

    def _unbound(self, a: Any) -> bool:
        return (
            self._kind(a) == z3.Z3_OP_UNINTERPRETED
            and C.Z3_get_app_num_args(self.ctx, a) == 0
            and self._name(a) not in self.slots
        )

    # -- code ---------------------------------------------------------------------------------
    def _define(self, f: Any) -> None:
        """Emit the assignment a definition makes (other facts are only checked)."""
        kind = self._kind(f)
        if kind == z3.Z3_OP_EQ:
            lhs, rhs = self._args(f)
            var, term = (lhs, rhs) if self._unbound(lhs) else (rhs, lhs)
            if self._unbound(var):
                value = self._expr(term)
                self.lines.append(f"V[{self._slot(self._name(var))}] = {value}")
        elif kind == z3.Z3_OP_LE:
            lhs, x = self._args(f)
            if self._kind(lhs) == z3.Z3_OP_MUL:
                d, q = self._args(lhs)
                if self._kind(d) == -1 and self._unbound(q):
                    value = self._expr(x)
                    divisor = C.Z3_get_numeral_string(self.ctx, d)
                    self.lines.append(f"V[{self._slot(self._name(q))}] = {value} // {divisor}")

    def _expr(self, a: Any) -> str:
        key = C.Z3_get_ast_id(self.ctx, a)
        if key in self.memo:
            return self.memo[key]
        kind = self._kind(a)
        if kind == -1:
            out = C.Z3_get_numeral_string(self.ctx, a)
        elif kind in (z3.Z3_OP_TRUE, z3.Z3_OP_FALSE):
            out = str(kind == z3.Z3_OP_TRUE)
        elif kind == z3.Z3_OP_UNINTERPRETED:
            name = self._name(a)
            if name not in self.slots:
                raise ValueError(f"{name} is used before it is defined")
            out = f"V[{self.slots[name]}]"
        else:
            out = self._temp(self._compound(kind, [self._expr(b) for b in self._args(a)]))
        self.memo[key] = out
        return out

    @staticmethod
    def _compound(kind: int, args: list[str]) -> str:
        if kind in _BINARY:
            return f"({args[0]} {_BINARY[kind]} {args[1]})"
        if kind in _NARY:
            return "(" + _NARY[kind].join(args) + ")"
        if kind == z3.Z3_OP_UMINUS:
            return f"(-{args[0]})"
        if kind == z3.Z3_OP_NOT:
            return f"(not {args[0]})"
        if kind == z3.Z3_OP_ITE:
            return f"({args[1]} if {args[0]} else {args[2]})"
        if kind == z3.Z3_OP_DISTINCT and len(args) == 2:
            return f"({args[0]} != {args[1]})"
        raise NotImplementedError(f"no Python for the z3 operator kind {kind}")

    def _temp(self, expr: str) -> str:
        name = f"t{len(self.lines)}"
        self.lines.append(f"{name} = {expr}")
        return name

    # -- use ----------------------------------------------------------------------------------
    def run(self, inputs: dict[str, int | bool]) -> Model:
        """Evaluate every variable from the inputs (by name); fail if a fact is false."""
        values: list[Any] = [None] * len(self.slots)
        for name, value in inputs.items():
            values[self.slots[name]] = value
        broken = self._run(values)
        if broken:
            shown = ", ".join(str(self.facts[i]) for i in broken[:3])
            raise AssertionError(f"the formula has no run for these inputs; false: {shown}")
        return Model(self, values)

    def reader(self, terms: list[z3.ExprRef]) -> Callable[[list], tuple]:
        """One compiled function that evaluates all ``terms`` over the defined variables."""
        lines, memo = self.lines, self.memo
        self.lines, self.memo = [], {}
        try:
            values = [self._expr(e.as_ast()) for e in terms]
            return _compile("read", [*self.lines, f"return ({', '.join(values)},)"])
        finally:
            self.lines, self.memo = lines, memo


def _compile(name: str, lines: list[str]) -> Callable[[list], Any]:
    scope: dict[str, Any] = {}
    body = "\n    ".join(lines)
    exec(f"def {name}(V):\n    {body}\n", scope)
    return scope[name]


class Model:
    """Concrete values of a :class:`Program`'s variables."""

    def __init__(self, program: Program, values: list[Any]) -> None:
        self.program, self.values = program, values

    def read(self, reader: Callable[[list], tuple]) -> tuple:
        return reader(self.values)
