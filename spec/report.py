"""The ``policykit.check/1`` document, built in one place.

``policykit check`` (here or on an executor), the executor's ``check_unit`` and the site's
one-combination-at-a-time fallback all report verdicts; each used to build its own rows, and
the ``refused`` rows twice, differently. Here are the rows (a verdict, a refusal, a unit that
could not run), the words of a verdict cut short, the configuration block with the budget, the
unit arguments that carry a check to another process or machine, and the document itself.
"""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Callable, Iterable
from typing import Any

import z3

from policykit.config import EngineConfig
from policykit.documents import stamped
from policykit.registry import Combo
from policykit.spec.bmc import Bounds
from policykit.spec.checker import CheckOptions, Verdict, config_dict, scope_text
from policykit.spec.isolation import Task, check_isolated

SCHEMA = "policykit.check/1"
VERDICT_ORDER = ("proved", "violated", "unknown", "refused")


def isolated_rows(
    combos: list[Combo],
    config: EngineConfig,
    options: CheckOptions,
    jobs: int = 1,
    on_done: Callable[[int, Combo], None] | None = None,
) -> list[dict[str, Any]]:
    """Every combo's rows (its verdicts, or one ``refused`` row per property where the checker
    cannot vouch for a policy), each combo in a fresh process
    (:mod:`policykit.spec.isolation`), in the order given; ``on_done`` hears of each."""
    tasks = [Task(c.as_dict(), config, options) for c in combos]
    rows: dict[int, list[dict[str, Any]]] = {}
    for i, found in check_isolated(tasks, jobs):
        rows[i] = found
        if on_done is not None:
            on_done(i, combos[i])
    return [row for i in range(len(combos)) for row in rows[i]]


def row_of(v: Verdict | dict[str, Any]) -> dict[str, Any]:
    """A verdict as a row, whether checked here (``Verdict``) or on an executor (a row)."""
    return v if isinstance(v, dict) else v.to_dict()


def failed_unit_row(combo: str, status: str, error: str | None) -> dict[str, Any]:
    """The row of a combo whose check could not run at all (a lost worker, the executor's
    timeout): ``unknown`` saying why, so it is never reported as passing."""
    note = f"unit {status}: {error}"
    return {
        "combo": combo,
        "property": "*",
        "verdict": "unknown",
        "bound": "-",
        "seconds": 0.0,
        "note": note,
        "shortfall": note,
        "counterexample": None,
    }


def shortfall_words(row: dict[str, Any]) -> str:
    """A verdict that reached less than was asked, in words: ``proved to round 2 of 4:
    <reason>`` or ``unknown at round 3: <reason>``; empty for any other verdict."""
    reason = row.get("shortfall") or ""
    if not reason:
        return ""
    bounds = row.get("bounds") or {}
    if row["verdict"] == "proved" and "rounds_asked" in bounds:
        return f"proved to round {bounds['rounds']} of {bounds['rounds_asked']}: {reason}"
    if row["verdict"] == "unknown":
        return f"unknown at {reason}" if reason.startswith("round ") else f"unknown: {reason}"
    return f"{row['verdict']}: {reason}"


def summary_counts(rows: Iterable[dict[str, Any]]) -> dict[str, int]:
    counts = Counter(r["verdict"] for r in rows)
    return {v: counts.get(v, 0) for v in VERDICT_ORDER}


def summary_line(rows: list[dict[str, Any]], combos: int) -> str:
    """``36 combos: 170 proved (160 unbounded), 10 violated, 0 unknown, 0 refused``."""
    counts = summary_counts(rows)
    unbounded = sum(r["verdict"] == "proved" and r["bound"] == "unbounded" for r in rows)
    parts = [f"{counts['proved']} proved ({unbounded} unbounded)"]
    parts += [f"{counts[v]} {v}" for v in VERDICT_ORDER[1:]]
    return f"{combos} combos: {', '.join(parts)}"


def config_block(
    config: EngineConfig, options: CheckOptions, timeout_s: float | None
) -> dict[str, Any]:
    """The configuration and budget every verdict of a run holds for."""
    return {
        **config_dict(config),
        "rounds": options.rounds,
        "requests": options.requests,
        "granule": options.bounds.granule_for(config),
        "pool_cap_tokens": options.bounds.max_pool_tokens,
        "min_swa_pool_tokens": options.bounds.min_swa_pool_tokens,
        "preempting_rounds": options.preempting_rounds,
        "preempting_requests": options.preempting_requests,
        "overtaking": options.overtaking,
        "rlimit": options.rlimit,
        "timeout_s": timeout_s,
        "scope": scope_text(config, options),
    }


def check_document(
    rows: list[dict[str, Any]],
    config: dict[str, Any],
    executor: dict[str, Any] | str,
    **extra: Any,
) -> dict[str, Any]:
    """The ``policykit.check/1`` document of ``rows``, stamped with ``schema`` and ``created``."""
    return stamped(
        {
            "device": f"CPU (z3 {z3.get_version_string()})",
            "executor": executor,
            "config": config,
            **extra,
            "summary": summary_counts(rows),
            "verdicts": rows,
        },
        SCHEMA,
    )


# -- a check as unit arguments (another process or machine) -----------------------------------
def unit_args(config: EngineConfig, options: CheckOptions) -> dict[str, Any]:
    """What a ``check_unit`` needs besides the combo: the configuration, the bounds and the
    budget (``rlimit``; ``deadline`` is the wall-clock safety net, a ``time.time()`` instant)."""
    return {
        "config": config.to_dict(),
        "rounds": options.rounds,
        "requests": options.requests,
        "rlimit": options.rlimit,
        "deadline": options.deadline,
        "granule": options.bounds.granule,
        "pool_cap": options.bounds.max_pool_tokens,
        "min_swa_pool": options.bounds.min_swa_pool_tokens,
        "properties": None if options.properties is None else list(options.properties),
        "preempting_rounds": options.preempting_rounds,
        "preempting_requests": options.preempting_requests,
        "overtaking": options.overtaking,
    }


def from_unit_args(args: dict[str, Any]) -> tuple[EngineConfig, CheckOptions]:
    """The inverse of :func:`unit_args`, with ``policykit check``'s defaults (a unit written
    before the configuration had a key of its own carries its numbers at the top level)."""
    config = EngineConfig.from_dict(args.get("config", args))
    defaults = CheckOptions()
    props = args.get("properties")
    options = CheckOptions(
        rounds=int(args.get("rounds", defaults.rounds)),
        requests=int(args.get("requests", defaults.requests)),
        rlimit=int(args.get("rlimit", defaults.rlimit)),
        bounds=Bounds(
            max_pool_tokens=int(args.get("pool_cap") or Bounds.max_pool_tokens),
            granule=args.get("granule"),
            min_swa_pool_tokens=args.get("min_swa_pool"),
        ),
        properties=None if props is None else tuple(props),
        deadline=args.get("deadline"),
        preempting_rounds=int(args.get("preempting_rounds", defaults.preempting_rounds)),
        preempting_requests=int(args.get("preempting_requests", defaults.preempting_requests)),
        overtaking=int(args.get("overtaking", defaults.overtaking)),
    )
    return config, options


def wall_deadline(timeout_s: float | None) -> float | None:
    """The safety net's instant for a command given ``timeout_s`` seconds from now."""
    return None if timeout_s is None else time.time() + timeout_s
