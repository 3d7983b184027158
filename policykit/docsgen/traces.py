"""One page per counterexample: what broke, in which round, and the replay that shows it.

A page titled "Counterexample" that ends in a green "no OOM" box tells the reader the opposite
of the truth. So the page opens with a failure banner saying in words which property broke
(the counterexample's own ``failure`` description when the checker gives one, else the
property and round from the verdict), marks the failing round in the replayed table, and tells
the replay's end as a failure, or as a warning when the scheduler did not reproduce it.
"""

from __future__ import annotations

import json
from typing import Any

from policykit.docsgen.labels import short_label
from policykit.docsgen.markdown import GENERATED_BANNER, Provenance, esc, fence, table
from policykit.docsgen.preempting_replay import (
    PreemptingReplay,
    preempting_failure_markdown,
    preempting_table,
    replay_preempting,
)
from policykit.docsgen.replay import (
    Replay,
    failure_markdown,
    replay,
    round_table,
    scenario_from,
)
from policykit.docsgen.results import VerdictRow
from policykit.errors import PolicykitError
from policykit.registry import PolicyRegistry

#: front matter: a trace page's round tables need the full width (Material hides both sidebars)
WIDE_PAGE = "---\nhide:\n  - navigation\n  - toc\n---\n\n"


def failing_round(v: VerdictRow, run: Replay | None = None) -> int | None:
    """The round the property broke in: the verdict's, else the last round of its trace, else
    the replay's OOM round."""
    if v.round is not None:
        return v.round
    rounds = [s["round"] for s in v.trace if isinstance(s.get("round"), int)]
    if rounds:
        return max(rounds)
    if run is not None and run.result.oom is not None:
        return run.result.oom.round
    return None


def _cell(value: Any) -> Any:
    return json.dumps(value) if isinstance(value, dict | list) else value


def _table_of(rows: list[dict[str, Any]]) -> str:
    """A table of ``rows`` without the columns that are empty in every row."""
    keys = list(dict.fromkeys(k for row in rows for k in row))
    keys = [k for k in keys if any(row.get(k) not in (None, "", [], {}) for row in rows)]
    return table(keys, [[_cell(row.get(k)) for k in keys] for row in rows])


def trace_tables(v: VerdictRow) -> list[str]:
    """The checker's trace: one table of rounds, one of the entries planned in them (one wide
    table of both would scroll sideways)."""
    if not v.steps and not v.trace:
        return []
    out = ["## Trace as the checker reports it\n\n"]
    if not v.steps:
        return [*out, _table_of(list(v.trace)), "\n"]
    rounds, entries = [], []
    for step in v.steps:
        nested = [
            k for k, x in step.items() if isinstance(x, list) and x and isinstance(x[0], dict)
        ]
        rounds.append({k: x for k, x in step.items() if k not in nested})
        for key in nested:
            entries += [{"round": step.get("round"), **e} for e in step[key]]
    out += [_table_of(rounds), "\n"]
    if entries:
        out += ["Entries planned in those rounds:\n\n", _table_of(entries), "\n"]
    return out


def what_broke(v: VerdictRow, at: int | None) -> str:
    """The failure in one sentence."""
    if v.failure:
        return v.failure
    where = f" in round {at}" if at is not None else ""
    return f"{v.property} is violated{where} under {short_label(v.combo)}"


def _replay(v: VerdictRow, registry: PolicyRegistry) -> Replay | PreemptingReplay | str | None:
    """The scheduler's run of the exported scenario (on the node that preempts for a combo
    that preempts, by the checker's own replay), why it could not run, or ``None``."""
    if v.scenario is None:
        return None
    try:
        scenario = scenario_from(v.scenario)
        combo = registry.resolve(scenario.combo, v.combo, config=scenario.config)
        if combo.preempts:
            return replay_preempting(v.scenario, combo, v.property, v.request)
        return replay(scenario, combo, registry)
    except PolicykitError as exc:
        return str(exc)


def trace_page(v: VerdictRow, registry: PolicyRegistry, provenance: Provenance) -> str:
    run = _replay(v, registry)
    at = failing_round(v, run if isinstance(run, Replay) else None)
    what = what_broke(v, at)
    parts = [
        WIDE_PAGE,
        GENERATED_BANNER,
        f"# Counterexample: {esc(v.property)} under `{short_label(v.combo)}`\n\n",
        f'!!! failure "Property broken: {esc(v.property)}'
        + (f" (round {at})" if at is not None else "")
        + f'"\n    {esc(what.rstrip("."))}.\n\n',
        provenance.note(),
        f"`policykit check` found **{esc(v.property)}** violated for `{v.combo}`"
        + (f" within {v.bound} rounds" if v.bound is not None else "")
        + ". [Back to the comparison](../index.md).\n\n",
        f"> {esc(v.note)}\n\n" if v.note else "",
    ]
    parts += trace_tables(v)
    if run is None:
        parts.append("The results file carries no exported scenario, so it cannot be replayed.\n")
        return "".join(parts)
    parts.append(
        "## Replayed by the scheduler\n\nThe counterexample exported as a scenario file, run by "
        "`policykit simulate` under the same combination"
        + (f"; the row marked ✗ is round {at}, where the property broke" if at else "")
        + ":\n\n"
    )
    if isinstance(run, Replay):
        parts.append(round_table(run, failing_round=at) + "\n" + failure_markdown(run, what))
    elif isinstance(run, PreemptingReplay):
        parts.append(
            "It runs on the node that preempts (vLLM's v1 scheduler, `policykit.preempting`): "
            "each step's chunks, the requests preempted, and the blocks in use and free after "
            "scheduling.\n\n"
            + preempting_table(run, failing_round=at)
            + "\n"
            + preempting_failure_markdown(run, what)
        )
    else:
        parts.append(f'!!! warning "Not replayable here"\n    {esc(run)}\n\n')
    parts += [
        "\n## Scenario file\n\nSave it as `counterexample.json` and replay it with "
        f"`policykit simulate counterexample.json --combo {v.combo}`.\n\n",
        fence(json.dumps(v.scenario, indent=2), "json"),
    ]
    return "".join(parts)
