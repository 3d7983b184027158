"""A fingerprint of every verdict of a ``policykit.check/1`` document.

A refactor of the checker (or of the node rules it shares with the scheduler) must not move a
verdict. Comparing two documents by eye does not scale to ``check --all``'s 1,100 rows, and
comparing them whole fails on what is meant to differ (timings, the ``created`` stamp). A
digest keeps two short hashes per ``combo | property``:

* ``verdict``: what the row claims -- the verdict, its bound (for a violation, the first round
  that breaks), note, shortfall and bounds, and of a counterexample the property and the kind
  of failure. A rewrite that keeps the semantics keeps every one of these. (The node that
  preempts is asked about every step in one query, so the round of its violation is the found
  model's, and is left out.)
* ``counterexample``: the counterexample's whole scenario and trace. These are the solver's
  first model, shrunk by replaying (:mod:`.shrink`, :mod:`.preempting_shrink`) from wherever
  that model started, so a formula rewritten into an equivalent one (``x > 0`` built as
  ``0 < x``) can land on another valid counterexample; a move here is listed, with its reason,
  in the recorded file's ``moved``, and each moved one must still replay.

``python -m policykit.spec.digest CHECK.json`` prints a digest; with a recorded digest after it,
it names the rows that moved, and counts apart the rows the recorded digest does not have (a
property added since, such as ``bounded-overtaking``): an addition moves nothing recorded.
"""

from __future__ import annotations

import hashlib
import json
import sys
from typing import Any

from policykit.documents import stamped

SCHEMA = "policykit.check-digest/2"
#: the fields of a row its verdict hash covers (``seconds`` is left out: it measures the machine)
CLAIM = ("verdict", "bound", "note", "shortfall", "bounds")


def _hash(value: Any) -> str:
    """The first 16 hex digits of the SHA-256 of ``value`` as canonical JSON."""
    text = json.dumps(value, sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def row_digest(row: dict[str, Any]) -> dict[str, str | None]:
    """A row's ``verdict`` and ``counterexample`` hashes (the latter None without one)."""
    cx = row.get("counterexample")
    claim: dict[str, Any] = {k: row.get(k) for k in CLAIM}
    if cx is not None:
        failure = cx.get("failure") or {}
        claim["counterexample"] = [cx.get("property"), failure.get("kind")]
        if (row.get("bounds") or {}).get("node") == "preempting":
            # one query over every step: the round is the found model's, not the first one
            # that breaks (SGLang's node deepens a round at a time, so its round is that)
            claim.pop("bound")
    return {"verdict": _hash(claim), "counterexample": None if cx is None else _hash(cx)}


def digest(document: dict[str, Any]) -> dict[str, dict[str, str | None]]:
    """``combo | property`` to :func:`row_digest` for every row of a check document."""
    return {f"{r['combo']} | {r['property']}": row_digest(r) for r in document["verdicts"]}


def differences(
    expected: dict[str, dict[str, str | None]], found: dict[str, dict[str, str | None]], part: str
) -> list[str]:
    """The recorded keys whose ``part`` hash differs, or that ``found`` lacks, sorted. A key
    only ``found`` has is an addition (:func:`additions`), not a move: a new property's rows
    leave every recorded verdict where it was."""
    return sorted(k for k in expected if k not in found or expected[k][part] != found[k][part])


def additions(
    expected: dict[str, dict[str, str | None]], found: dict[str, dict[str, str | None]]
) -> dict[str, list[str]]:
    """The keys only ``found`` has, by property (``combo | property``'s second part)."""
    out: dict[str, list[str]] = {}
    for key in sorted(found.keys() - expected.keys()):
        out.setdefault(key.rsplit(" | ", 1)[-1], []).append(key)
    return out


def record_moves(
    recorded: dict[str, Any], found: dict[str, Any], moved: list[str], why: str
) -> None:
    """Take the counterexample hashes of the ``moved`` rows from ``found`` into ``recorded``,
    and list them with ``why`` (the verdict hashes are never taken over this way)."""
    for key in moved:
        recorded["rows"][key]["counterexample"] = found[key]["counterexample"]
    recorded.setdefault("moved", []).append({"why": why, "rows": moved})


def main(argv: list[str]) -> int:
    """``CHECK.json``: print its digest. ``CHECK.json RECORDED.json``: compare the two, exit 1
    and name the rows that moved if they differ. ``... --moved WHY``: where only
    counterexamples moved, record their new hashes in RECORDED.json, saying why."""
    why = None
    if len(argv) == 4 and argv[2] == "--moved":
        argv, why = argv[:2], argv[3]
    usage = "usage: python -m policykit.spec.digest CHECK.json [RECORDED.json [--moved WHY]]"
    if argv and argv[0] in ("-h", "--help"):
        print(usage + "\n\n" + (main.__doc__ or ""))
        return 0
    if len(argv) not in (1, 2) or any(a.startswith("-") for a in argv):
        print(usage, file=sys.stderr)
        return 2
    try:
        documents = [_read(path) for path in argv]
    except (OSError, ValueError) as exc:
        print(f"policykit.spec.digest: {exc}", file=sys.stderr)
        return 2
    document = documents[0]
    found = digest(document)
    if len(argv) == 1:
        out = {"device": document.get("device"), "config": document.get("config"), "rows": found}
        print(json.dumps(stamped(out, SCHEMA), indent=1, sort_keys=True))
        return 0
    recorded = documents[1]
    moved = {
        part: differences(recorded["rows"], found, part) for part in ("verdict", "counterexample")
    }
    for part, keys in moved.items():
        for key in keys:
            print(f"{part} moved: {key}")
    added = additions(recorded["rows"], found)
    for prop, keys in added.items():
        print(f"added: {len(keys)} rows of {prop} (not in the recorded digest)")
    print(
        f"{len(found)} rows: {len(moved['verdict'])} verdicts moved, "
        f"{len(moved['counterexample'])} counterexamples moved, "
        f"{sum(map(len, added.values()))} added"
    )
    if why is not None and moved["counterexample"] and not moved["verdict"]:
        record_moves(recorded, found, moved["counterexample"], why)
        with open(argv[1], "w") as fh:
            fh.write(json.dumps(recorded, indent=1, sort_keys=True) + "\n")
        print(f"recorded the moved counterexamples in {argv[1]}")
        return 0
    return 1 if any(moved.values()) else 0


def _read(path: str) -> dict[str, Any]:
    """A JSON document, or a ValueError that names the file and what is wrong with it."""
    with open(path) as fh:
        try:
            return json.load(fh)
        except json.JSONDecodeError as exc:
            raise ValueError(f"{path} is not JSON: {exc}") from None


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
