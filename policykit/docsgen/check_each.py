"""Checking combinations one at a time, so that one uncheckable policy costs one row only.

``policykit docs`` gets its verdicts from ``policykit check --all --json``. If that command
fails as a whole (one installed plugin's policy cannot be read symbolically, say it uses a
float), the docs must not lose every other verdict: they check each combination here instead,
and a combination whose check raises gets a ``refused`` verdict with the checker's reason.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Callable, Sequence
from typing import Any

import z3

from policykit.errors import PolicykitError
from policykit.policy import EngineConfig
from policykit.registry import Combo, PolicyRegistry

SCHEMA = "policykit.check/1"
#: ``policykit check``'s defaults, the configuration the comparison page's verdicts are for
PAGE_SIZE = 64
CHUNK_SIZE = 4096


def refused(combo: Combo, reason: str) -> dict[str, Any]:
    """The verdict row of a combination the checker could not trust."""
    return {
        "combo": combo.as_dict(),
        "property": "*",
        "verdict": "refused",
        "bound": None,
        "seconds": 0.0,
        "note": reason,
        "counterexample": None,
    }


def check_each(
    registry: PolicyRegistry,
    *,
    combos: Sequence[Combo] | None = None,
    rounds: int = 4,
    requests: int = 3,
    on_combo: Callable[[int, int, Combo], None] | None = None,
) -> dict[str, Any]:
    """A ``policykit.check/1`` document for ``combos`` (default: all registered), each
    checked on its own; a policy error becomes a ``refused`` row instead of an abort."""
    from policykit.spec.checker import CheckOptions, check_combo
    from policykit.spec.model import ModelConfig

    engine = EngineConfig(PAGE_SIZE, CHUNK_SIZE)
    chosen = list(combos if combos is not None else registry.all_combos(engine))
    config = ModelConfig(PAGE_SIZE, CHUNK_SIZE)
    options = CheckOptions(rounds=rounds, requests=requests)
    verdicts: list[dict[str, Any]] = []
    for i, combo in enumerate(chosen):
        if on_combo is not None:
            on_combo(i, len(chosen), combo)
        try:
            verdicts += [v.to_dict() for v in check_combo(combo, config, options)]
        except PolicykitError as exc:
            verdicts.append(refused(combo, " ".join(str(exc).split())))
    return {
        "schema": SCHEMA,
        "created": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
        "device": f"CPU (z3 {z3.get_version_string()})",
        "executor": {"name": "policykit docs, one combination at a time"},
        "config": {
            "page_size": PAGE_SIZE,
            "chunked_prefill_size": CHUNK_SIZE,
            "swa_window": None,
            "rounds": rounds,
            "requests": requests,
            "granule": PAGE_SIZE,
        },
        "verdicts": verdicts,
    }
