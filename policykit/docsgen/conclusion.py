"""The comparison page's first paragraph: which combo to use for what, read off the results.

A reader opening the comparison page wants the answer before the tables: "for X, use Y". Prose
written by hand would go stale with the next results file, so every clause here is computed
from the results the page is built from: for each production-trace replay, the combo with the
lowest TTFT p99, the one with the shortest maximum wait and the one that serves the longest
prompts fastest (where the rows carry the ``fairness`` block), each against the engines'
defaults present in the same replay, and only among rows that completed every request with
none starved; the combos that ran out of memory; and from ``policykit check``, how many combos
carry a proof of every property. A figure absent from the results is never stated.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from policykit.docsgen.labels import short_label
from policykit.docsgen.results import CheckResults, TraceBenchResults, combo_key

#: the engines' own defaults, as a replay's rows name them: (who, combo)
DEFAULTS: tuple[tuple[str, str], ...] = (
    ("SGLang's default", "sglang/sglang/page"),
    ("vLLM's default", "vllm/vllm/none/default/fcfs/vllm"),
)

Metric = Callable[[dict[str, Any]], float | None]


def _ttft_p99(row: dict[str, Any]) -> float | None:
    return row["predicted"]["ttft_s"]["p99"]


def _max_wait(row: dict[str, Any]) -> float | None:
    wait = (row.get("fairness") or {}).get("max_wait")
    return None if wait is None else wait["seconds"]


def _long_p99(row: dict[str, Any]) -> float | None:
    classes = (row.get("fairness") or {}).get("size_classes") or {}
    return (classes.get(">8k") or {}).get("ttft_s", {}).get("p99")


#: (what the reader wants, how a row scores it: lower is better)
GOALS: tuple[tuple[str, Metric], ...] = (
    ("the lowest TTFT p99", _ttft_p99),
    ("the shortest maximum wait", _max_wait),
    ("the fastest long prompts (over 8k tokens, TTFT p99)", _long_p99),
)


def sound(row: dict[str, Any]) -> bool:
    """A row a reader may be pointed to: the replay drained (nothing pending, nothing failed,
    no crash) and no request starved. A request rejected for good (one no pool of this size
    can ever hold) is allowed; :func:`trace_clauses` keeps only the rows that completed the
    most requests, so a combo never wins by rejecting work."""
    req = row["outcomes"]["requests"]
    return (
        row.get("crash") is None
        and row["status"] == "completed"
        and not req.get("starved")
        and not req.get("failed")
        and not row.get("starvation")
    )


def _name(combo: str) -> str:
    return f"`{short_label(combo_key(combo))}`"


def _against(
    rows: dict[str, dict[str, Any]], metric: Metric, best: tuple[float, str], most: int | None
) -> str:
    """The best figure (value, combo key) against each engine default the replay has
    (``most``: the requests the best rows completed)."""
    parts = []
    for who, combo in DEFAULTS:
        key = combo_key(combo)
        row = rows.get(key)
        value = None if row is None else metric(row)
        if row is None or value is None:
            continue
        if key == best[1]:
            parts.append(f"it is {who}")
        elif not sound(row) or row["outcomes"]["requests"]["completed"] != most:
            parts.append(f"{who} does not complete the trace")
        elif value > best[0]:
            parts.append(f"{1 - best[0] / value:.0%} below {who}'s {value:.3g} s")
        else:
            parts.append(f"{who} is as good")
    return f" ({'; '.join(parts)})" if parts else ""


def _pick(scored: list[tuple[float, str]], proved: frozenset[str]) -> tuple[tuple[float, str], int]:
    """The best (value, key) and how many others tie with it. Among ties: one whose every
    checked property is proved (``proved``), then an engine default (no reason to move off
    it), then the first in the results' order."""
    low = min(value for value, _ in scored)
    tied = [key for value, key in scored if value == low]
    defaults = {combo_key(c) for _, c in DEFAULTS}
    chosen = min(tied, key=lambda k: (k not in proved, k not in defaults, tied.index(k)))
    return (low, chosen), len(tied) - 1


def trace_clauses(bench: TraceBenchResults, proved: frozenset[str] = frozenset()) -> list[str]:
    """A "for X on this trace, use Y" clause for each goal the rows measure, and what ran out of
    memory; ``proved``: the combo keys whose every checked property is proved."""
    rows = {combo_key(r["combo"]): r for r in bench.rows}
    name = str(bench.trace.get("name", "the trace"))
    done = [r["outcomes"]["requests"]["completed"] for r in rows.values() if sound(r)]
    most = max(done, default=None)
    eligible = {
        k: r for k, r in rows.items() if sound(r) and r["outcomes"]["requests"]["completed"] == most
    }
    clauses = []
    for goal, metric in GOALS:
        scored = [(v, k) for k, r in eligible.items() if (v := metric(r)) is not None]
        if not scored:
            continue
        best, ties = _pick(scored, proved)
        alike = f" (or {ties} alike)" if ties else ""
        clauses.append(
            f"for {goal} on {name}, use {_name(best[1])}{alike}: {best[0]:.3g} s"
            + _against(rows, metric, best, most)
        )
    crashed = [k for k, r in rows.items() if r.get("crash") is not None]
    if crashed:
        clauses.append(
            f"avoid the {len(crashed)} combos that run out of memory on {name} "
            f"(such as {_name(crashed[0])})"
        )
    return clauses


def _verdicts(checks: Sequence[CheckResults]) -> dict[str, set[str]]:
    """Per combo key, the verdicts its properties got."""
    verdicts: dict[str, set[str]] = {}
    for check in checks:
        for v in check.verdicts:
            verdicts.setdefault(combo_key(v.combo), set()).add(v.verdict)
    return verdicts


def check_clause(checks: Sequence[CheckResults]) -> str | None:
    """How many checked combos carry a proof of every property they were asked."""
    verdicts = _verdicts(checks)
    if not verdicts:
        return None
    proved = [c for c, seen in verdicts.items() if seen == {"proved"}]
    return (
        f"for a combo that carries a proof, pick among the {len(proved)} of {len(verdicts)} "
        "checked whose every property is proved (the matrix below)"
    )


def conclusion(traces: Sequence[TraceBenchResults], checks: Sequence[CheckResults]) -> str:
    """The page's opening paragraph, or "" when there are no results to conclude from."""
    proved = frozenset(c for c, seen in _verdicts(checks).items() if seen == {"proved"})
    clauses = [c for bench in traces for c in trace_clauses(bench, proved)]
    proof = check_clause(checks)
    if proof is not None:
        clauses.append(proof)
    if not clauses:
        return ""
    text = "; ".join(clauses)
    return (
        "**In short** (computed from the results below; predicted seconds): "
        + text[0].lower()
        + text[1:]
        + ".\n\n"
    )
