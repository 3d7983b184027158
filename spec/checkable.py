"""Whether the checker can reason about a combo at all, asked before anything is run.

``simulate`` and ``bench`` run any policy, but a user comparing policies should know when one of
them is outside what ``policykit check`` can vouch for (a float, state, the clock): they warn
with the reason instead of failing. The question is answered by the checker's own first step,
the cross-validation of :mod:`policykit.spec.crossval` (each decision lifted under the guard,
then compared with Python on concrete views), so a policy refused here is refused there.

:func:`check_or_refuse` is the other side: ``check`` turns a refusal into ``refused`` verdicts
for that combo, and goes on with the others.
"""

from __future__ import annotations

import time

from policykit.config import EngineConfig
from policykit.errors import PolicykitError
from policykit.registry import Combo
from policykit.spec.checker import (
    CheckOptions,
    Verdict,
    check_combo,
    combo_label,
    config_dict,
    properties_for,
)
from policykit.spec.crossval import check_policies
from policykit.spec.overtaking import OVERTAKING, check_overtaking
from policykit.spec.preempting_check import check_preempting, preempting_properties


def checkable(combo: Combo, engine: EngineConfig) -> str | None:
    """The reason ``policykit check`` would refuse ``combo`` on ``engine``, or ``None``."""
    try:
        check_policies(combo, engine)
    except PolicykitError as exc:
        return str(exc)
    return None


#: the verdict of a combo the checker cannot reason about (see :func:`check_or_refuse`)
REFUSED = "refused"


def check_or_refuse(
    combo: Combo,
    config: EngineConfig,
    options: CheckOptions,
    sources: dict[str, str] | None = None,
) -> list[Verdict]:
    """:func:`~policykit.spec.checker.check_combo` (for a combo that preempts,
    :func:`~policykit.spec.preempting_check.check_preempting`), except that a combo the checker
    refuses (a :class:`~policykit.errors.PolicykitError` while encoding it: a float, an
    unsupported construct, a policy that raised) gives one ``refused`` verdict per property,
    the reason as its note, instead of an exception: ``check --all`` goes on with the other
    combos."""
    t0 = time.perf_counter()
    try:
        if combo.preempts:
            return check_preempting(combo, config, options, sources or {})
        return check_sglang_node(combo, config, options, sources)
    except PolicykitError as exc:
        seconds = time.perf_counter() - t0
        reason = " ".join(str(exc).split())
        scope = config_dict(config)
        return [
            Verdict(combo_label(combo), prop, REFUSED, "-", seconds, note=reason, config=scope)
            for prop in combo_properties(combo, config, options.properties)
        ]


def check_sglang_node(
    combo: Combo,
    config: EngineConfig,
    options: CheckOptions,
    sources: dict[str, str] | None = None,
) -> list[Verdict]:
    """Every property of a combo on SGLang's kind of node: ``check_combo``'s, then
    ``bounded-overtaking`` (after them: their cross-validation vouches for the policies first).
    ``check`` and the SGLang plugin's start-up check both ask here, so they list the same
    properties."""
    verdicts = check_combo(combo, config, options, sources)
    if OVERTAKING in combo_properties(combo, config, options.properties):
        verdicts.append(check_overtaking(combo, config, options, sources or {}))
    return verdicts


def combo_properties(
    combo: Combo, config: EngineConfig, wanted: tuple[str, ...] | None = None
) -> list[str]:
    """The properties ``combo`` is checked for: a node that preempts has its own (without
    ``bounded-overtaking``, which is not modelled there); SGLang's node adds
    ``bounded-overtaking`` (:mod:`policykit.spec.overtaking`) to :func:`properties_for`."""
    if combo.preempts:
        return preempting_properties(wanted)
    extra = [OVERTAKING] if wanted is None or OVERTAKING in wanted else []
    return properties_for(config, wanted) + extra
