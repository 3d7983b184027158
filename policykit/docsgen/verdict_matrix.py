"""The formal-verdict section: a summary in words, then a matrix readable at a glance.

A flat table of 100-odd combinations × 6 properties of "✓ proved (unbounded)" hides the one
thing a reader wants: which combinations are safe, for what, under which engine settings. So
the section opens with that answer, and the matrix folds the combinations into rows of
admission × queue × chunking and columns of alignment, each cell one mark per property.
"""

from __future__ import annotations

import html
from collections.abc import Sequence

from policykit.docsgen.labels import describe_set, short_label, trace_slug
from policykit.docsgen.markdown import esc, table
from policykit.docsgen.results import CheckResults, VerdictRow, combo_parts
from policykit.registry import DEFAULT_COMBO

#: one plain glyph per verdict; common system fonts carry all of them (no emoji font offline)
MARKS = {
    "proved": "✓",
    "bounded": "◑",
    "violated": "✗",
    "unknown": "?",
    "refused": "⊘",
    "missing": "–",
}
LEGEND = {
    "proved": "proved for any number of rounds and requests (induction)",
    "bounded": "proved only up to the bound shown (bounded model checking)",
    "violated": "violated: links to the counterexample, replayed by the scheduler",
    "unknown": "unknown: the solver gave up (never counted as safe)",
    "refused": "refused: the checker could not trust a policy (the reason is in the summary)",
    "missing": "not checked",
}


def mark_of(v: VerdictRow | None) -> str:
    """The legend key of a verdict (``proved`` is reserved for unbounded proofs)."""
    if v is None:
        return "missing"
    if v.verdict == "proved":
        return "proved" if v.unbounded else "bounded"
    return v.verdict


def mark_html(v: VerdictRow | None, prop: str) -> str:
    """One property's mark in a cell: a coloured glyph whose tooltip says the whole verdict."""
    kind = mark_of(v)
    words = {
        "proved": "proved (unbounded)",
        "bounded": f"proved to K={v.bound}" if v is not None else "",
        "violated": f"violated (K={v.bound})" if v is not None and v.bound else "violated",
        "unknown": "unknown",
        "refused": "refused",
        "missing": "not checked",
    }[kind]
    if v is not None and v.shortfall:
        words = v.shortfall
    note = f" — {v.note}" if v is not None and v.note else ""
    title = html.escape(f"{prop}: {words}{note}", quote=True)
    glyph = MARKS[kind]
    if kind == "violated" and v is not None:
        glyph = f"[{glyph}](traces/{trace_slug(v)}.md)"
    return f'<span class="pk-{kind}" title="{title}">{glyph}</span>'


def verdict_cell(v: VerdictRow | None) -> str:
    """A single verdict in words (the trace pages and tooltips use the same wording)."""
    kind = mark_of(v)
    if v is None:
        return "– not checked"
    text = {
        "proved": "proved (unbounded)",
        "bounded": f"proved (to K={v.bound})",
        "violated": f"[violated (K={v.bound})](traces/{trace_slug(v)}.md)"
        if v.bound is not None
        else f"[violated](traces/{trace_slug(v)}.md)",
        "unknown": "unknown",
        "refused": "refused",
    }[kind]
    if v.shortfall and kind in ("bounded", "unknown"):
        text = html.escape(v.shortfall)  # "proved to round 2 of 4: <reason>", in the cell
    title = f' title="{html.escape(v.note, quote=True)}"' if v.note else ""
    return f'<span class="pk-{kind}"{title}>{MARKS[kind]} {text}</span>'


def config_sentence(check: CheckResults) -> str:
    """The engine configuration the verdicts hold under, in words."""
    c = check.config
    if not c:
        return "The results file does not record the engine configuration it was checked under."
    swa = c.get("sliding_window")
    parts = [
        f"page size **{c.get('page_size', '?')}** tokens",
        f"chunk size (`chunked_prefill_size`) **{c.get('chunked_prefill_size', '?')}** tokens",
        f"sliding window **{swa}** tokens (hybrid SWA)" if swa else "no sliding window",
    ]
    bounds = ""
    if c.get("rounds") is not None:
        bounds = (
            f" Bounded checks explored up to **K={c['rounds']}** rounds with "
            f"**N={c.get('requests', '?')}** requests"
            + (f", prompt lengths in multiples of {c['granule']}" if c.get("granule") else "")
            + "."
        )
    return "Checked under " + ", ".join(parts) + "." + bounds


def _combo_of(key: str) -> tuple[str, str, str, str]:
    """(admission, queue, chunking, alignment) of a combo key; the allocator phase, which no
    verdict depends on, is named beside the admission only when it is not the default."""
    parts = combo_parts(key)
    admission = parts["admission"]
    if parts["allocator-phase"] != DEFAULT_COMBO["allocator-phase"]:
        admission += f" (allocator {parts['allocator-phase']})"
    queue = parts["queue"]
    if parts["preemption"] != DEFAULT_COMBO["preemption"]:
        # a combo that preempts runs on another node: its own row, not its twin's
        queue += f" (preemption {parts['preemption']})"
    return admission, queue, parts["chunking"], parts["alignment"]


class _Lookup:
    """Verdicts by (combo, property); a verdict for property ``*`` (the whole combo could not
    be checked) stands for every property of that combo."""

    def __init__(self, check: CheckResults) -> None:
        self.by = {(v.combo, v.property): v for v in check.verdicts}

    def get(self, key: tuple[str, str]) -> VerdictRow | None:
        return self.by.get(key) or self.by.get((key[0], "*"))

    def __contains__(self, key: tuple[str, str]) -> bool:
        return self.get(key) is not None


def summary(check: CheckResults, combos: Sequence[str], properties: Sequence[str]) -> str:
    """Which combinations are safe for which properties, in a few bullet lines."""
    by = _Lookup(check)
    refused = {v.combo: v for v in check.verdicts if v.verdict == "refused"}
    extra = [c for c in dict.fromkeys(v.combo for v in check.verdicts) if c not in combos]
    checked = [c for c in [*combos, *extra] if any((c, p) in by for p in properties)]

    def with_mark(*kinds: str) -> list[str]:
        return [c for c in checked if all(mark_of(by.get((c, p))) in kinds for p in properties)]

    safe = with_mark("proved")
    bounded_safe = [c for c in with_mark("proved", "bounded") if c not in safe]
    universe = [*combos, *extra]
    lines = [
        f"- **Safe for every property, unbounded** ({len(safe)} of {len(checked)} checked): "
        + describe_set(safe, universe)
        + ".",
    ]
    if bounded_safe:
        bounds = sorted(
            {
                v.bound
                for c in bounded_safe
                for p in properties
                if (v := by.get((c, p))) is not None and mark_of(v) == "bounded" and v.bound
            }
        )
        within = " or ".join(f"K={k}" for k in bounds) or "the bounds"
        lines.append(
            f"- **Safe for every property, but only up to {within} rounds** "
            f"({len(bounded_safe)}): " + describe_set(bounded_safe, universe) + "."
        )
    for prop in properties:
        broken = [c for c in checked if mark_of(by.get((c, prop))) == "violated"]
        unsure = [c for c in checked if mark_of(by.get((c, prop))) == "unknown"]
        if not broken and not unsure:
            continue
        said = []
        if broken:
            said.append(f"**violated** by {len(broken)}: {describe_set(broken, universe)}")
        if unsure:
            said.append(f"**unknown** for {len(unsure)}: {describe_set(unsure, universe)}")
        lines.append(f"- `{prop}` is " + "; ".join(said) + ".")
    for combo, v in refused.items():
        reason = esc(v.note) or "no reason recorded"
        lines.append(f"- **Refused** `{short_label(combo)}`: {reason}")
    return "\n".join(lines) + "\n\n"


def legend(properties: Sequence[str]) -> str:
    order = ", ".join(f"{i}. `{p}`" for i, p in enumerate(properties, 1))
    marks = " · ".join(
        f'<span class="pk-{k}">{MARKS[k]}</span> {LEGEND[k]}' for k in MARKS if k != "missing"
    )
    return (
        f"Each cell has one mark per property, in this order: {order}. "
        f"Hover a mark for its verdict.\n\n{marks} · {MARKS['missing']} not checked.\n\n"
    )


def matrix(check: CheckResults, combos: Sequence[str], properties: Sequence[str]) -> str:
    """Rows admission × queue × chunking, columns alignment, cells one mark per property.

    The queue has a column of its own: it changes verdicts (SGLang's ``fcfs`` lets a request
    that can never fit starve the queue behind it, ``fcfs-skip`` does not), so a row that
    hid it would show one queue's verdicts as every queue's."""
    by = _Lookup(check)
    extra = [c for c in dict.fromkeys(v.combo for v in check.verdicts) if c not in combos]
    everything = [*combos, *extra]
    keyed: dict[tuple[str, str, str], dict[str, str]] = {}
    alignments: list[str] = []
    for combo in everything:
        admission, queue, chunking, alignment = _combo_of(combo)
        if combo in extra:
            admission += " (not registered here)"
        keyed.setdefault((admission, queue, chunking), {})[alignment] = combo
        if alignment not in alignments:
            alignments.append(alignment)
    rows = []
    for (admission, queue, chunking), cells in keyed.items():
        row = [f"`{admission}`", f"`{queue}`", f"`{chunking}`"]
        for alignment in alignments:
            cell = cells.get(alignment)
            if cell is None:
                row.append("")
                continue
            marks = "".join(mark_html(by.get((cell, p)), p) for p in properties)
            row.append(f'<span class="pk-cell">{marks}</span>')
        rows.append(row)
    headers = ["admission", "queue", "chunking", *(f"`{a}`" for a in alignments)]
    return table(headers, rows)


def check_section(check: CheckResults, combos: Sequence[str]) -> str:
    properties = list(dict.fromkeys(v.property for v in check.verdicts if v.property != "*"))
    counts = {w: sum(mark_of(v) == w for v in check.verdicts) for w in MARKS}
    return (
        "## Formal verdicts\n\n"
        + check.provenance.note()
        + config_sentence(check)
        + "\n\n"
        + summary(check, combos, properties)
        + f"From `{check.source.name}`: {counts['proved']} proved unbounded, "
        f"{counts['bounded']} proved within bounds, {counts['violated']} violated, "
        f"{counts['unknown']} unknown, {counts['refused']} refused.\n\n"
        + legend(properties)
        + matrix(check, combos, properties)
        + "\n"
    )
