"""The comparison page's lead: every combo replayed through a production trace.

One row per *behaviour*: combos whose outcomes are identical on the trace share a row ("12
combos behave identically"), so the rows that remain are the differences. Predicted figures
carry three significant digits (the roofline is not more precise than that); the scheduler's
own wall time never appears as a winner. The load sweep below the table shows where each row
stops coping, and the text says why rows differ, from which policy separates them and from the
replay's own crash messages.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from policykit.docsgen import plots
from policykit.docsgen.labels import short_label
from policykit.docsgen.markdown import Links, esc, table
from policykit.docsgen.results import TraceBenchResults, TraceSweepResults, combo_parts

PAGE = "generated/comparisons/index.md"
#: why rows separated by one policy differ, for the policies whose effect on a trace is known
WHY: dict[tuple[str, str], str] = {
    ("alignment", "checkpoint"): "a non-final chunk must end on a multiple of the checkpoint "
    "interval, so every truncated chunk gives back up to 255 tokens of its round's compute "
    "budget: long prompts need more rounds, and the requests queued behind them wait longer",
    ("alignment", "truncation"): "every non-final chunk is cut to a multiple of the split "
    "size, which also leaves part of each round's budget unused",
    ("admission", "no-evict"): "a request enters only if KV for its whole prompt fits without "
    "evicting anything (no credit for a cache hit), so on a pool kept full of cached prefixes "
    "requests wait for memory instead of evicting",
    ("admission", "reserve-tail"): "the tail of a truncated request is reserved in the memory "
    "ledger, so a host-tier load-back entering through an alignment gap cannot take it",
    ("admission", "sglang"): "the memory ledger does not count a truncated request's tail, "
    "which is safe only while the truncated chunk uses up the whole compute budget",
}
KINDS = ("admission", "chunking", "alignment")
#: the fairness block's prompt-size classes, smallest first (``harness.trace_fairness``)
SIZE_CLASSES = ("<1k", "1k-8k", ">8k")


def sig(x: float | None) -> str:
    """Three significant digits, or a dash."""
    return "-" if x is None else f"{x:.3g}"


def breakable(combo: str) -> str:
    """A combo's printed name that may wrap after each ``/`` (a browser breaks a name at its
    hyphens, but not at a slash, so a long six-part combo would widen its column)."""
    return short_label(_key(combo)).replace("/", "/<wbr>")


def _label(group: dict[str, Any]) -> str:
    """A group's row label: its representative, and the combos the row folds in, named in a
    folded list (plain text, not code: the names may wrap in a narrow column)."""
    rep = group["representative"]
    others = [c for c in group["combos"] if _key(c) != _key(rep)]
    if not others:
        return breakable(rep)
    folded = ", ".join(breakable(c) for c in others)
    return (
        f'{breakable(rep)} <details class="pk-fold"><summary>+{len(others)} alike</summary>'
        f"{folded}</details>"
    )


def _status(row: dict[str, Any]) -> str:
    if row.get("crash"):
        return f"**OOM in round {row['crash']['round']:,}**"
    req = row["outcomes"]["requests"]
    if req["starved"] or row.get("starvation"):
        return f"starves ({req['starved']} waited > 1000 rounds)"
    return row["status"]


def group_table(bench: TraceBenchResults) -> str:
    rows = {r["combo"]: r for r in bench.rows}
    cells = []
    for group in bench.groups:
        row = rows[group["representative"]]
        o, p = row["outcomes"], row["predicted"]
        req = o["requests"]
        cells.append(
            [
                _label(group),
                f"{_status(row)}, {req['completed']:,}/{req['total']:,} done",
                f"{sig(p['ttft_s']['p50'])}/{sig(p['ttft_s']['p99'])}",
                f"{sig(o['ttft_rounds']['p50'])}/{sig(o['ttft_rounds']['p99'])}",
                f"{o['prefix_hit_rate']:.1%}",
                f"{o['recomputed_tokens']:,} / {o['load_back_tokens']:,}",
                f"{o['pool_use']['peak']:.0%}",
            ]
        )
    gpu = bench.replay.get("clock", {}).get("gpu", "?")
    return table(
        [
            "combos",
            "outcome",
            f"TTFT p50/p99 s ({gpu})",
            "TTFT p50/p99 rounds",
            "hit rate",
            "recomputed / loaded back",
            "peak pool",
        ],
        cells,
        right=(2, 3, 4, 5, 6),
    )


def fairness_part(bench: TraceBenchResults) -> str:
    """Who waited, per behaviour: TTFT p99 by prompt size, the longest wait, preemptions and
    the tokens they made the node compute again (rows from before ``fairness`` have none)."""
    rows = {r["combo"]: r for r in bench.rows}
    groups = [g for g in bench.groups if rows[g["representative"]].get("fairness")]
    if not groups:
        return ""
    cells = []
    for group in groups:
        row = rows[group["representative"]]
        f, req = row["fairness"], row["outcomes"]["requests"]
        classes = f["size_classes"]
        wait = f["max_wait"] or {}
        cells.append(
            [
                _label(group),
                " / ".join(sig(classes[c]["ttft_s"]["p99"]) for c in SIZE_CLASSES),
                " / ".join(sig(classes[c]["ttft_s"]["max"]) for c in SIZE_CLASSES),
                sig(wait.get("seconds")),
                f"{f['preemptions']:,} / {f['recomputed_after_preemption_tokens']:,}",
                f"{req['completed']:,}/{req['total']:,}, {req['starved']:,} starved",
            ]
        )
    return (
        "Who waited: TTFT by prompt size (under 1,024 tokens / 1,024 to 8,192 / above), the "
        "longest a request went without a chunk, and preemptions with the tokens they made "
        "the node compute again.\n\n"
        + table(
            [
                "combos",
                "TTFT p99 s by size",
                "TTFT max s by size",
                "max wait s",
                "preempted / recomputed",
                "completed",
            ],
            cells,
            right=(1, 2, 3, 4),
        )
        + "\n"
    )


def _separating_kinds(bench: TraceBenchResults) -> list[str]:
    """Policy kinds whose value alone tells the groups apart (constant within a group,
    different between some groups)."""
    out = []
    for kind in KINDS:
        within = all(
            len({combo_parts(_key(c))[kind] for c in g["combos"]}) == 1 for g in bench.groups
        )
        values = {combo_parts(_key(g["representative"]))[kind] for g in bench.groups}
        if within and len(values) > 1:
            out.append(kind)
    return out


def _key(combo: str) -> str:
    from policykit.docsgen.results import combo_key

    return combo_key(combo)


def why(bench: TraceBenchResults) -> str:
    """Why the rows differ, in words: the crashes as the replay reported them, then what the
    separating policies do."""
    rows = {r["combo"]: r for r in bench.rows}
    n = len(bench.rows)
    if len(bench.groups) == 1:
        return (
            f"All {n} combinations take the same decisions in every round of this replay: "
            "the trace never creates a situation where their policies disagree.\n\n"
        )
    parts = [f"The {n} combinations fall into **{len(bench.groups)} behaviours**. "]
    for group in bench.groups:
        if group["size"] > 1:
            parts.append(
                f"{group['size']} combos behave identically on this trace to "
                f"`{short_label(group['representative'])}`. "
            )
    for group in bench.groups:
        row = rows[group["representative"]]
        if row.get("crash"):
            crash = row["crash"]
            parts.append(
                f"`{short_label(group['representative'])}` (and {group['size'] - 1} alike) runs "
                f"out of memory in round {crash['round']:,}: {esc(crash['message'] or '')} "
            )
    kinds = _separating_kinds(bench)
    for kind in kinds:
        for group in bench.groups:
            name = combo_parts(_key(group["representative"]))[kind].split(":")[0]
            reason = WHY.get((kind, name))
            if reason:
                parts.append(f"With {kind} `{name}`, {reason}. ")
    if not kinds:
        parts.append(
            "No single policy kind separates them: the differences come from how the policies "
            "combine. "
        )
    return "".join(dict.fromkeys(parts)) + "\n\n"


def _sweep_rows(sweep: TraceSweepResults) -> list[plots.SweepRow]:
    groups: dict[tuple, list[str]] = {}
    for combo, points in sweep.combos.items():
        key = (
            tuple(p.get("verdict", "failed") for p in points),
            tuple(p.get("crash_round") for p in points),
        )
        groups.setdefault(key, []).append(short_label(_key(combo)))
    return [
        plots.SweepRow(tuple(labels), verdicts, crashes)
        for (verdicts, crashes), labels in groups.items()
    ]


def _ttft_series(sweep: TraceSweepResults) -> list[tuple[str, list[float | None]]]:
    groups: dict[tuple, list[str]] = {}
    for combo, points in sweep.combos.items():
        key = tuple(
            None
            if p.get("verdict") == "oom" or p.get("ttft_p99_s") is None
            else float(f"{p['ttft_p99_s']:.3g}")
            for p in points
        )
        groups.setdefault(key, []).append(short_label(_key(combo)))
    out = []
    for values, labels in list(groups.items())[: plots.MAX_PANELS]:
        more = f" (+{len(labels) - 1})" if len(labels) > 1 else ""
        out.append((labels[0] + more, list(values)))
    return out


def sweep_part(sweep: TraceSweepResults, plot_dir: Path, slug: str) -> str:
    loads = sweep.points
    requests = sweep.trace.get("requests")
    name = f"trace-{slug}-load-sweep.svg"
    plots.load_sweep_chart(
        plot_dir / name,
        _sweep_rows(sweep),
        loads,
        title=f"Where each combination stops coping: {sweep.trace.get('name')}, "
        f"{requests} requests",
    )
    ttft = f"trace-{slug}-ttft-by-load.svg"
    plots.ttft_by_load_chart(
        plot_dir / ttft,
        _ttft_series(sweep),
        loads,
        title="TTFT p99 against load (predicted; log scale, not from zero)",
    )
    return (
        "### Load sweep\n\n"
        + sweep.provenance.note()
        + f"The same replay at {len(loads)} loads (arrival rate × "
        + ", ".join(f"{x:g}" for x in loads)
        + "), every combination at every load as one executor unit. A row is a group of "
        "combinations with the same verdict at every load; read along a row to where it "
        "first turns amber (a request starves) or red (out of memory).\n\n"
        f"![Load sweep: verdict per combination and load]({'plots/' + name})\n\n"
        f"![TTFT p99 against load]({'plots/' + ttft})\n\n"
    )


def trace_section(
    bench: TraceBenchResults, sweep: TraceSweepResults | None, plot_dir: Path, links: Links
) -> str:
    t, r = bench.trace, bench.replay
    slug = str(t.get("name", "trace")).replace("/", "-")
    reuse = t.get("reusable_block_share") or 0.0
    rates = sorted(row["outcomes"]["prefix_hit_rate"] for row in bench.rows)
    hit = f"{rates[0]:.1%}" if rates[0] == rates[-1] else f"{rates[0]:.1%} to {rates[-1]:.1%}"
    prefix = (
        f"{reuse:.1%} of its 512-token blocks repeat an earlier block (the hit rate of a "
        f"cache that never forgets); the replay's prefix hit rate is {hit} (device radix "
        "cache plus host-tier load-backs, over the prompt tokens processed)."
        if t.get("has_prefixes")
        else "This trace has no prefix information: no request shares a token with another, "
        "so its hit rate is zero by construction (none is invented)."
    )
    coverage = " ".join(
        f"{k.replace('_', ' ').capitalize()}: {v}." for k, v in bench.coverage.items()
    )
    parts = [
        f"## Production trace: {esc(str(t.get('name')))}\n\n",
        bench.provenance.note(),
        f"{esc(str(t.get('description', '')))} {esc(str(t.get('citation') or ''))}\n\n",
        f"{t.get('requests', 0):,} requests, {t.get('prompt_tokens', 0):,} prompt tokens; pool "
        f"{r.get('pool_tokens', 0):,} tokens ({esc(str(r.get('pool_source', '')))}), chunk "
        f"{r.get('chunked_prefill_size')}, time scale {r.get('time_scale')}, host tier "
        f"`{r.get('host_tier', 'off')}`. {prefix} How the trace becomes rounds: "
        + links.to("Production traces", "traces.md", page=PAGE)
        + ".\n\n",
        f"{esc(coverage)}\n\n" if coverage else "",
        why(bench),
        group_table(bench),
        "\n",
        fairness_part(bench),
    ]
    if sweep is not None:
        parts.append(sweep_part(sweep, plot_dir, slug))
    return "".join(parts)
