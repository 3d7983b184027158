"""Whether the checker can reason about a combo at all, asked before anything is run.

``simulate`` and ``bench`` run any policy, but a user comparing policies should know when one of
them is outside what ``policykit check`` can prove (a float, an unsupported call): they warn
with the reason instead of failing. The question is answered by evaluating each decision method
of each policy once, symbolically, on a view whose numbers are fresh unknowns: the same
evaluator the checker uses, so a policy refused here is refused there.

:func:`check_or_refuse` is the other side: ``check`` turns a refusal into ``refused`` verdicts
for that combo, and goes on with the others.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from dataclasses import fields
from typing import Any

from policykit.errors import PolicykitError
from policykit.policy import (
    AdmitView,
    AlignView,
    ChunkView,
    EngineConfig,
    Policy,
    TailView,
)
from policykit.registry import Combo
from policykit.spec.checker import (
    CheckOptions,
    Verdict,
    check_combo,
    combo_label,
    properties_for,
)
from policykit.spec.model import ModelConfig
from policykit.spec.symbolic import Sym, evaluate, int_var

#: decision methods per kind, with the view each one receives
_METHODS: dict[str, tuple[tuple[str, type], ...]] = {
    "admission": (("admit", AdmitView), ("tail_reserve", TailView)),
    "chunking": (("new_chunk", ChunkView), ("resume_chunk", ChunkView)),
    "alignment": (("align_end", AlignView),),
}


def _fresh_view(view_cls: type, engine: EngineConfig, prefix: str) -> Any:
    """A view whose numbers are fresh symbols, except the engine's concrete facts."""
    values: dict[str, Any] = {}
    for f in fields(view_cls):
        if f.name == "page_size":
            values[f.name] = engine.page_size
        elif f.name == "hybrid_swa":
            values[f.name] = engine.hybrid_swa
        else:
            values[f.name] = Sym(int_var(f"{prefix}.{f.name}"))
    return view_cls(**values)


def _calls(combo: Combo) -> Iterator[tuple[Policy, str, type]]:
    for policy in combo.policies():
        for method, view_cls in _METHODS.get(policy.kind, ()):
            yield policy, method, view_cls


def checkable(combo: Combo, engine: EngineConfig) -> str | None:
    """The reason ``policykit check`` would refuse ``combo`` on ``engine``, or ``None``."""
    for policy, method, view_cls in _calls(combo):
        view = _fresh_view(view_cls, engine, f"{policy.kind}.{method}")
        try:
            evaluate(policy, method, view, source=policy.source)
        except PolicykitError as exc:
            return str(exc)
    return None


#: the verdict of a combo the checker cannot reason about (see :func:`check_or_refuse`)
REFUSED = "refused"


def check_or_refuse(
    combo: Combo,
    config: ModelConfig,
    options: CheckOptions,
    sources: dict[str, str] | None = None,
) -> list[Verdict]:
    """:func:`~policykit.spec.checker.check_combo`, except that a combo the checker refuses
    (a :class:`~policykit.errors.PolicykitError` while encoding it: a float, an unsupported
    construct, a policy that raised) gives one ``refused`` verdict per property, the reason as
    its note, instead of an exception: ``check --all`` goes on with the other combos."""
    t0 = time.perf_counter()
    try:
        return check_combo(combo, config, options, sources)
    except PolicykitError as exc:
        seconds = time.perf_counter() - t0
        reason = " ".join(str(exc).split())
        return [
            Verdict(combo_label(combo), prop, REFUSED, "-", seconds, note=reason)
            for prop in properties_for(config, options.properties)
        ]
