"""One page per counterexample: what broke, in which round, and the replay that shows it.

A page titled "Counterexample" that ends in a green "no OOM" box tells the reader the opposite
of the truth. So the page opens with a failure banner saying in words which property broke
(the counterexample's own ``failure`` description when the checker gives one, else the
property and round from the verdict), marks the failing round in the replayed table, and tells
the replay's end as a failure, or as a warning when the scheduler did not reproduce it.
"""

from __future__ import annotations

import json

from policykit.docsgen.labels import short_label
from policykit.docsgen.markdown import GENERATED_BANNER, Provenance, esc, fence, table
from policykit.docsgen.replay import (
    Replay,
    failure_markdown,
    replay,
    round_table,
    scenario_from,
)
from policykit.docsgen.results import Verdict
from policykit.errors import PolicykitError
from policykit.registry import PolicyRegistry


def failing_round(v: Verdict, run: Replay | None = None) -> int | None:
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


def what_broke(v: Verdict, at: int | None) -> str:
    """The failure in one sentence."""
    if v.failure:
        return v.failure
    where = f" in round {at}" if at is not None else ""
    return f"{v.property} is violated{where} under {short_label(v.combo)}"


def _replay(v: Verdict, registry: PolicyRegistry) -> Replay | str | None:
    """The scheduler's run of the exported scenario, why it could not run, or ``None``."""
    if v.scenario is None:
        return None
    try:
        return replay(scenario_from(v.scenario), v.combo, registry)
    except PolicykitError as exc:
        return str(exc)


def trace_page(v: Verdict, registry: PolicyRegistry, provenance: Provenance) -> str:
    run = _replay(v, registry)
    at = failing_round(v, run if isinstance(run, Replay) else None)
    what = what_broke(v, at)
    parts = [
        GENERATED_BANNER,
        f"# Counterexample: {esc(v.property)} under `{short_label(v.combo)}`\n\n",
        f'!!! failure "Property broken: {esc(v.property)}'
        + (f" (round {at})" if at is not None else "")
        + f'"\n    {esc(what)}.\n\n',
        provenance.note(),
        f"`policykit check` found **{esc(v.property)}** violated for `{v.combo}`"
        + (f" within {v.bound} rounds" if v.bound is not None else "")
        + ". [Back to the comparison](../index.md).\n\n",
        f"> {esc(v.note)}\n\n" if v.note else "",
    ]
    if v.trace:
        keys = list(dict.fromkeys(k for step in v.trace for k in step))
        rows = [
            [
                s.get(k) if not isinstance(s.get(k), dict | list) else json.dumps(s.get(k))
                for k in keys
            ]
            for s in v.trace
        ]
        parts += ["## Trace as the checker reports it\n\n", table(keys, rows), "\n"]
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
    else:
        parts.append(f'!!! warning "Not replayable here"\n    {esc(run)}\n\n')
    parts += [
        "\n## Scenario file\n\nSave it as `counterexample.json` and replay it with "
        f"`policykit simulate counterexample.json --combo {v.combo}`.\n\n",
        fence(json.dumps(v.scenario, indent=2), "json"),
    ]
    return "".join(parts)
