"""How the comparison pages name combinations: short labels, table cells, grouped lists.

A combination's canonical key (``admission=...,chunking=...,alignment=...,allocator-phase=...,
queue=...``) is what ``--combo`` accepts; the pages show the shorter printed form
``admission/chunking/alignment[/allocator-phase[/queue]]``, which ``--combo`` accepts too, and
link to traces by a slug of it.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import replace

from policykit.config import EngineConfig
from policykit.docsgen.results import VerdictRow, combo_key, combo_parts
from policykit.registry import (
    COMBO_SEPARATOR,
    DEFAULT_COMBO,
    VERDICT_KINDS,
    PolicyRegistry,
    format_combo,
)

#: the engine facts registered combinations are enumerated for (the bundled scenarios' page)
ENUMERATION_CONFIG = EngineConfig()
#: the kinds a table gives a column each: those that change a verdict
SHOWN_KINDS = VERDICT_KINDS


def registered_combos(registry: PolicyRegistry) -> list[str]:
    """Canonical keys of every combination the registry enumerates, in registry order."""
    return [combo_key(c.as_dict()) for c in registry.all_combos(ENUMERATION_CONFIG)]


def preempting_combos(registry: PolicyRegistry) -> list[str]:
    """Keys of the combinations that preempt (vLLM's node): the verdict kinds with each
    preemption policy that preempts. They are checked (``check --all``) but not benched on
    every page, so the verdict matrix lists those a check file has after
    :func:`registered_combos`."""
    kinds = (*VERDICT_KINDS, "preemption")
    return [
        combo_key(c.as_dict())
        for c in registry.all_combos(ENUMERATION_CONFIG, kinds=kinds)
        if c.preempts
    ]


def sliding_window_only(registry: PolicyRegistry) -> list[str]:
    """Keys of the combinations that run only with a sliding window (``sglang-pre-swa-fix``
    refuses a plain pool), which :func:`registered_combos` therefore leaves out."""
    plain = set(registered_combos(registry))
    # any window: a policy's validation asks only whether there is one
    swa = replace(ENUMERATION_CONFIG, sliding_window=4096)
    keys = [combo_key(c.as_dict()) for c in registry.all_combos(swa)]
    return [k for k in keys if k not in plain]


def short_label(key: str) -> str:
    """The combo as the tool prints it everywhere (``--combo`` accepts it back)."""
    return format_combo(combo_parts(key))


def combo_cells(key: str) -> list[str]:
    """One table cell per shown kind (the allocator phase, where not the default, folded into
    the alignment's)."""
    parts = combo_parts(key)
    cells = [f"`{parts[k]}`" for k in SHOWN_KINDS]
    if parts["allocator-phase"] != DEFAULT_COMBO["allocator-phase"]:
        cells[SHOWN_KINDS.index("alignment")] += f" (allocator `{parts['allocator-phase']}`)"
    return cells


def trace_slug(verdict: VerdictRow) -> str:
    raw = f"{short_label(verdict.combo)}--{verdict.property}"
    return re.sub(r"[^a-z0-9]+", "-", raw.lower()).strip("-")


def describe_set(keys: Iterable[str], universe: Iterable[str]) -> str:
    """A set of combinations in words, grouped by admission: ``sglang`` with any chunking and
    alignment; ``reserve-tail`` with ``sglang/page``, ... (``universe``: every combination
    checked, to say "any" when an admission's whole row is in the set)."""
    chosen = list(dict.fromkeys(keys))
    if not chosen:
        return "none"
    by_admission: dict[str, list[str]] = {}
    for key in universe:
        by_admission.setdefault(combo_parts(key)["admission"], []).append(key)
    groups: dict[str, list[str]] = {}
    for key in chosen:
        groups.setdefault(combo_parts(key)["admission"], []).append(key)
    out = []
    for admission, members in groups.items():
        if set(members) >= set(by_admission.get(admission, [])):
            out.append(f"`{admission}` with any chunking, alignment and queue")
            continue
        rest = [COMBO_SEPARATOR.join(short_label(k).split(COMBO_SEPARATOR)[1:]) for k in members]
        out.append(f"`{admission}` with " + ", ".join(f"`{r}`" for r in rest))
    return "; ".join(out)
