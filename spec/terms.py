"""Evaluating a z3 term at many concrete points, fast.

Cross-validation evaluates each lifted policy function at a few hundred views. Substituting
values into the z3 term and simplifying costs about a millisecond a point; compiling the term
once into straight-line Python (one assignment per shared sub-term) costs about that once, and
then a few microseconds a point. Only the operators the symbolic evaluator itself produces are
supported: linear integer arithmetic, floor division and modulo by constants, comparisons,
boolean connectives and ``If``. Anything else raises ``ValueError`` (a bug in the checker,
not in the policy).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import z3

_BINARY = {
    z3.Z3_OP_LE: "<=",
    z3.Z3_OP_LT: "<",
    z3.Z3_OP_GE: ">=",
    z3.Z3_OP_GT: ">",
    z3.Z3_OP_EQ: "==",
    z3.Z3_OP_IDIV: "//",
    z3.Z3_OP_MOD: "%",
}
_NARY = {z3.Z3_OP_ADD: "+", z3.Z3_OP_MUL: "*", z3.Z3_OP_SUB: "-"}


def compile_terms(
    inputs: Sequence[z3.ExprRef],
    outputs: Sequence[z3.ExprRef],
    quotients: Sequence[tuple[z3.ExprRef, int, z3.ExprRef]] = (),
) -> Callable[..., tuple[Any, ...]]:
    """A Python function of ``inputs`` (positional ints) returning ``outputs``' values.

    ``quotients`` defines variables ``q = x // d`` (the evaluator's floor divisions).
    """
    defined = {q.get_id(): (x, d) for x, d, q in quotients}
    names: dict[int, str] = {}
    lines: list[str] = []
    args = []
    for i, v in enumerate(inputs):
        names[v.get_id()] = f"a{i}"
        args.append(f"a{i}")

    def visit(e: z3.ExprRef) -> str:
        key = e.get_id()
        if key in names:
            return names[key]
        if z3.is_int_value(e):
            return str(e.as_long())
        if key in defined:
            x, d = defined[key]
            name = f"n{len(lines)}"
            lines.append(f"    {name} = ({visit(x)}) // {d}")
            names[key] = name
            return name
        if z3.is_true(e):
            return "True"
        if z3.is_false(e):
            return "False"
        kind = e.decl().kind()
        kids = [visit(c) for c in e.children()]
        if kind in _NARY:
            expr = f" {_NARY[kind]} ".join(f"({k})" for k in kids)
        elif kind in _BINARY and len(kids) == 2:
            expr = f"({kids[0]}) {_BINARY[kind]} ({kids[1]})"
        elif kind == z3.Z3_OP_UMINUS:
            expr = f"-({kids[0]})"
        elif kind == z3.Z3_OP_ITE:
            expr = f"({kids[1]}) if ({kids[0]}) else ({kids[2]})"
        elif kind == z3.Z3_OP_AND:
            expr = " and ".join(f"({k})" for k in kids) or "True"
        elif kind == z3.Z3_OP_OR:
            expr = " or ".join(f"({k})" for k in kids) or "False"
        elif kind == z3.Z3_OP_NOT:
            expr = f"not ({kids[0]})"
        elif kind == z3.Z3_OP_DISTINCT and len(kids) == 2:
            expr = f"({kids[0]}) != ({kids[1]})"
        else:
            raise ValueError(f"cannot compile the z3 term {e.sexpr()[:80]}")
        name = f"n{len(lines)}"
        lines.append(f"    {name} = {expr}")
        names[key] = name
        return name

    results = [visit(o) for o in outputs]
    source = f"def f({', '.join(args)}):\n" + "\n".join(lines)
    source += f"\n    return ({', '.join(results)},)\n"
    scope: dict[str, Any] = {}
    exec(compile(source, "<policykit.spec.terms>", "exec"), scope)
    return scope["f"]
