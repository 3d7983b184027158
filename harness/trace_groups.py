"""Group combos that behave identically on a trace, so that the differences stand out.

On a real trace most combos take the same decisions in every round: their policies differ only
in situations the trace never creates. Two rows are *identical* when every deterministic
outcome and every predicted figure is equal (the scheduler's wall time, the only measured
figure, is left out: it is noise on a shared machine, not a behaviour).
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable, Sequence
from typing import Any

from policykit.registry import Combo

#: row fields that say what a combo did (not how long this machine took to say it)
BEHAVIOUR = (
    "status",
    "crash",
    "never_completes",
    "starvation",
    "outcomes",
    "predicted",
    "fairness",
)


def behaviour_key(row: dict[str, Any]) -> str:
    """A canonical text of everything a combo decided on the trace."""
    return json.dumps({k: row.get(k) for k in BEHAVIOUR}, sort_keys=True)


def group_identical(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Rows grouped by behaviour, in the order each behaviour first appears:
    ``[{"combos": [...], "row": first row}, ...]``."""
    groups: dict[str, dict[str, Any]] = {}
    for row in rows:
        key = behaviour_key(row)
        if key in groups:
            groups[key]["combos"].append(row["combo"])
        else:
            groups[key] = {"combos": [row["combo"]], "row": row}
    return list(groups.values())


# --- combos that decide alike by construction ---------------------------------------------------
#: why a follower's row is its leader's (:func:`skip_twins`)
SKIP_TWIN = (
    "its queue differs from {leader}'s only in skipping a request that can never fit; that "
    "replay skipped none, so every round decided the same"
)
#: why a shadow's row is its leader's (:mod:`policykit.harness.trace_shadow`)
SHADOW = (
    "planned every round of {leader}'s replay on its node and made the same plan each time, "
    "with nothing decided outside the plan, so that replay is its own"
)

#: what a replay row measured on this machine (a row that is another's replay has none)
TIMES = ("scheduler_seconds",)
#: ``(combo, shadows, rows done so far) -> (its row, the shadows it carried)``
ShadowedReplay = Callable[[Combo, list[Combo], int], tuple[dict[str, Any], list[Combo]]]


def _skip_twin_key(combo: Combo) -> tuple[str, ...] | None:
    """What a combo is apart from whether its arrival-order queue skips never-fitting requests
    (``None`` for a sorting queue, which has no such twin)."""
    if not combo.queue.arrival_order:
        return None
    return tuple(p.spec for p in combo.policies() if p.kind != "queue")


def skip_twins(combos: Sequence[Combo]) -> list[tuple[Combo, list[Combo]]]:
    """``combos`` as (leader, followers), leaders in their order, every combo once.

    Two combos whose policies are equal but for an arrival-order queue, one that skips a
    request that can never fit (``fcfs-skip``) and one that stops at it (``fcfs``), decide the
    same in every round up to the first request the skipping one rejects for good: the planner
    reads ``skips_never_fitting`` only there, and neither queue asks ``priority``. The leader is
    the skipping one; a follower's row is the leader's when the leader's replay rejected nothing
    for good (``never_fit_skips`` is 0), and is replayed on its own otherwise."""
    leaders: dict[tuple[str, ...], Combo] = {}
    for combo in combos:
        key = _skip_twin_key(combo)
        if key is not None and combo.queue.skips_never_fitting:
            leaders.setdefault(key, combo)
    followers: dict[str, list[Combo]] = {}
    out: list[tuple[Combo, list[Combo]]] = []
    for combo in combos:
        key = _skip_twin_key(combo)
        leader = None if key is None or combo.queue.skips_never_fitting else leaders.get(key)
        if leader is not None:
            followers.setdefault(str(leader), []).append(combo)
        else:
            out.append((combo, followers.setdefault(str(combo), [])))
    return out


def unit_groups(combos: Sequence[Combo]) -> list[list[str]]:
    """The printed combos of each executor unit: the arrival-order queues together (a
    follower of :func:`skip_twins` needs its leader's replay), each sorting queue apart
    (shadows share the leader's queue policy), in the order of ``combos``."""
    units: dict[str, list[str]] = {}
    for combo in combos:
        key = "" if combo.queue.arrival_order else combo.queue.spec
        units.setdefault(key, []).append(str(combo))
    return list(units.values())


def replay_grouped(combos: Iterable[Combo], replay: ShadowedReplay) -> list[dict[str, Any]]:
    """A row per combo, in their order, replaying as few as is proved enough: the leaders of
    :func:`skip_twins` with shadows (:func:`replay_with_shadows`); a follower gets its leader's
    row when that replay skipped nothing, else is replayed (with shadows) too."""
    combos = list(combos)
    rows: dict[str, dict[str, Any]] = {}
    groups = skip_twins(combos)
    replay_with_shadows([leader for leader, _ in groups], replay, rows)
    alone = []
    for leader, followers in groups:
        row = rows[str(leader)]
        for twin in followers:
            if row.get("never_fit_skips") == 0:
                rows[str(twin)] = twin_row(row, leader, twin, SKIP_TWIN, TIMES)
            else:
                alone.append(twin)
    replay_with_shadows(alone, replay, rows)
    return [rows[str(c)] for c in combos]


def replay_with_shadows(
    combos: list[Combo], replay: ShadowedReplay, rows: dict[str, dict[str, Any]]
) -> None:
    """Replay ``combos`` into ``rows``: each with the combos of its queue policy not replayed
    yet as shadows, those it carried to the end taking its row."""
    pending = list(combos)
    while pending:
        leader, rest = pending[0], pending[1:]
        mates = [c for c in rest if c.queue.spec == leader.queue.spec]
        row, carried = replay(leader, mates, len(rows))
        rows[str(leader)] = row
        for shadow in carried:
            rows[str(shadow)] = twin_row(row, leader, shadow, SHADOW, TIMES)
        pending = [c for c in rest if str(c) not in rows]


def twin_row(
    row: dict[str, Any], leader: Combo, twin: Combo, why: str, unmeasured: tuple[str, ...] = ()
) -> dict[str, Any]:
    """``leader``'s row as ``twin``'s: the same decisions, marked ``same_replay_as`` with
    ``why``; the ``unmeasured`` fields (times this machine took for the leader) become None."""
    return {
        **row,
        **dict.fromkeys(unmeasured),
        "combo": str(twin),
        "policies": twin.as_dict(),
        "same_replay_as": {"combo": str(leader), "why": why.format(leader=leader)},
    }
