"""Checking combinations one at a time, so that one uncheckable policy costs one row only.

``policykit docs`` gets its verdicts from ``policykit check --all --json``. If that command
fails as a whole (one installed plugin's policy cannot be read symbolically, say it uses a
float), the docs must not lose every other verdict: they check each combination here instead,
and a combination the checker refuses gets ``refused`` rows with the checker's reason, built
by :mod:`policykit.spec.report` exactly as ``policykit check`` builds them.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from policykit.config import EngineConfig
from policykit.registry import Combo, PolicyRegistry


def check_each(
    registry: PolicyRegistry,
    *,
    combos: Sequence[Combo] | None = None,
    rounds: int = 4,
    requests: int = 3,
    on_combo: Callable[[int, int, Combo], None] | None = None,
) -> dict[str, Any]:
    """A ``policykit.check/1`` document for ``combos`` (default: all registered), each
    checked on its own; a policy error becomes ``refused`` rows instead of an abort."""
    from policykit.spec.checker import CheckOptions
    from policykit.spec.report import check_document, config_block, isolated_rows

    config = EngineConfig()  # ``policykit check``'s defaults, as the comparison page says
    chosen = list(combos if combos is not None else registry.all_combos(config))
    options = CheckOptions(rounds=rounds, requests=requests)
    if on_combo is not None and chosen:
        on_combo(0, len(chosen), chosen[0])
    done = iter(range(1, len(chosen) + 1))

    def next_combo(i: int, combo: Combo) -> None:
        if on_combo is not None:
            on_combo(next(done), len(chosen), combo)

    rows = isolated_rows(chosen, config, options, on_done=next_combo)
    return check_document(
        rows,
        config_block(config, options, None),
        {"name": "policykit docs, one combination at a time"},
    )
