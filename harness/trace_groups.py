"""Group combos that behave identically on a trace, so that the differences stand out.

On a real trace most combos take the same decisions in every round: their policies differ only
in situations the trace never creates. Two rows are *identical* when every deterministic
outcome and every predicted figure is equal (the scheduler's wall time, the only measured
figure, is left out: it is noise on a shared machine, not a behaviour).
"""

from __future__ import annotations

import json
from typing import Any

#: row fields that say what a combo did (not how long this machine took to say it)
BEHAVIOUR = ("status", "crash", "never_completes", "starvation", "outcomes", "predicted")


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
