"""The comparison pages: combinations side by side.

Three sections, each from its own source and each stating where and when it was measured:

* **formal verdicts** from ``policykit check`` results: one row per registered combination,
  one column per property, every violation linked to its rendered counterexample trace;
* **scenario replays**: every registered combination run through the bundled scenarios by the
  real scheduler (computed here, so the page is never empty of measured behaviour);
* **harness** tables and plots per workload from ``policykit bench`` results.
"""

from __future__ import annotations

import html
import json
import re
from dataclasses import dataclass
from pathlib import Path

from policykit.docsgen import plots
from policykit.docsgen.concepts import HYBRID_SWA
from policykit.docsgen.markdown import GENERATED_BANNER, Provenance, esc, fence, table
from policykit.docsgen.replay import Replay, replay, rounds_markdown, scenario_from
from policykit.docsgen.results import (
    BenchResults,
    CheckResults,
    Results,
    Verdict,
    combo_key,
    combo_parts,
    now_utc,
)
from policykit.errors import PolicykitError
from policykit.policy import EngineConfig
from policykit.registry import DEFAULT_COMBO, PolicyRegistry, format_combo

#: scenarios every combination is replayed through
REPLAY_SCENARIOS: tuple[str, ...] = ("seed-abc", "seed-incident-1keim", str(HYBRID_SWA))
#: the engine facts registered combinations are enumerated for (the bundled scenarios' page)
ENUMERATION_CONFIG = EngineConfig(page_size=64, chunked_prefill_size=4096)
_SHOWN_KINDS = ("admission", "chunking", "alignment")
#: marks in the verdict matrix; plain symbols that the common system fonts carry (no emoji font
#: is needed offline), coloured by the site's extra.css
_MARK = {"proved": "✓", "violated": "✗", "unknown": "?", "refused": "–"}


def registered_combos(registry: PolicyRegistry) -> list[str]:
    """Canonical keys of every combination the registry enumerates, in registry order."""
    return [combo_key(c.as_dict()) for c in registry.all_combos(ENUMERATION_CONFIG)]


def short_label(key: str) -> str:
    """The combo as the tool prints it everywhere (``policykit.registry.format_combo``)."""
    return format_combo(combo_parts(key))


def _combo_cells(key: str) -> list[str]:
    parts = combo_parts(key)
    cells = [f"`{parts[k]}`" for k in _SHOWN_KINDS]
    if parts["allocator-phase"] != DEFAULT_COMBO["allocator-phase"]:
        cells[-1] += f" (allocator `{parts['allocator-phase']}`)"
    return cells


def trace_slug(verdict: Verdict) -> str:
    raw = f"{short_label(verdict.combo)}--{verdict.property}"
    return re.sub(r"[^a-z0-9]+", "-", raw.lower()).strip("-")


# --- formal verdicts ----------------------------------------------------------------------------
def verdict_cell(v: Verdict | None) -> str:
    if v is None:
        return "— not checked"
    if v.verdict == "violated":
        bound = f" (K={v.bound})" if v.bound is not None else ""
        text = f"[violated{bound}](traces/{trace_slug(v)}.md)"
    elif v.verdict == "proved":
        text = f"proved ({'unbounded' if v.unbounded else f'to K={v.bound}'})"
    else:
        text = v.verdict
    title = f' title="{html.escape(v.note, quote=True)}"' if v.note else ""
    return f'<span class="pk-{v.verdict}"{title}>{_MARK[v.verdict]} {text}</span>'


def check_section(check: CheckResults, combos: list[str]) -> str:
    properties = list(dict.fromkeys(v.property for v in check.verdicts))
    by_cell = {(v.combo, v.property): v for v in check.verdicts}
    extra = [c for c in dict.fromkeys(v.combo for v in check.verdicts) if c not in combos]
    rows = []
    for combo in combos + extra:
        cells = _combo_cells(combo)
        if combo in extra:
            cells[0] += " (not registered here)"
        rows.append(cells + [verdict_cell(by_cell.get((combo, p))) for p in properties])
    counts = {w: sum(v.verdict == w for v in check.verdicts) for w in _MARK}
    return (
        "## Formal verdicts\n\n"
        + check.provenance.note()
        + f"From `{check.source.name}`: {counts['proved']} proved, {counts['violated']} violated, "
        f"{counts['unknown']} unknown. *Unbounded* means proved for any number of rounds and "
        "requests (induction); *to K* means no violation within K rounds (bounded model "
        "checking). Each violation links to its counterexample, replayed by the scheduler.\n\n"
        + table([*_SHOWN_KINDS, *properties], rows)
        + "\n"
    )


def trace_page(v: Verdict, registry: PolicyRegistry, provenance: Provenance) -> str:
    parts = [
        GENERATED_BANNER,
        f"# Counterexample: {esc(v.property)} under `{short_label(v.combo)}`\n\n",
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
    if v.scenario is None:
        parts.append("The results file carries no exported scenario, so it cannot be replayed.\n")
        return "".join(parts)
    parts.append(
        "## Replayed by the scheduler\n\nThe counterexample exported as a scenario file, run by "
        "`policykit simulate` under the same combination:\n\n"
    )
    try:
        run = replay(scenario_from(v.scenario), v.combo, registry)
        parts.append(rounds_markdown(run) + "\n")
    except PolicykitError as exc:
        parts.append(f'!!! warning "Not replayable here"\n    {esc(exc)}\n\n')
    parts += [
        "## Scenario file\n\nSave it as `counterexample.json` and replay it with "
        f"`policykit simulate counterexample.json --combo {v.combo}`.\n\n",
        fence(json.dumps(v.scenario, indent=2), "json"),
    ]
    return "".join(parts)


# --- scenario replays ---------------------------------------------------------------------------
@dataclass(frozen=True)
class ScenarioReplays:
    scenario: str
    runs: dict[str, Replay | str]  #: combo key -> run, or why it could not run


def replay_all(registry: PolicyRegistry, combos: list[str]) -> list[ScenarioReplays]:
    out = []
    for source in REPLAY_SCENARIOS:
        scenario = scenario_from(source)
        runs: dict[str, Replay | str] = {}
        for combo in combos:
            try:
                runs[combo] = replay(scenario, combo, registry)
            except PolicykitError as exc:
                runs[combo] = f"not supported: {exc}"
        out.append(ScenarioReplays(scenario.name, runs))
    return out


def _utilisation_series(replays: ScenarioReplays) -> list[tuple[str, list[float]]]:
    """One line per distinct trajectory; combinations that behave alike share a label."""
    groups: dict[tuple[str, tuple[float, ...]], list[str]] = {}
    for combo, run in replays.runs.items():
        if isinstance(run, Replay):
            key = (run.outcome, tuple(round(u, 4) for u in run.pool_use_by_round))
            groups.setdefault(key, []).append(short_label(combo))
    series = []
    for (outcome, ys), labels in groups.items():
        more = f" and {len(labels) - 1} more" if len(labels) > 1 else ""
        series.append((f"{outcome}: {labels[0]}{more}", list(ys)))
    return series


def replay_section(all_replays: list[ScenarioReplays], combos: list[str], plot_dir: Path) -> str:
    provenance = Provenance(
        device="CPU (torch tensors; scheduler only, no model)",
        model=None,
        date=now_utc(),
        produced_by="`policykit docs` replaying the bundled scenarios through the scheduler",
    )
    rows = []
    for combo in combos:
        cells = _combo_cells(combo)
        for rep in all_replays:
            run = rep.runs[combo]
            cells.append(run.outcome if isinstance(run, Replay) else run)
        rows.append(cells)
    parts = [
        "## Scenario replays\n\n",
        provenance.note(),
        "Every registered combination run through each scenario until nothing can change "
        "(`policykit simulate SCENARIO --combo ...`). The scenarios are explained on "
        "[The tail and the alignment gap](../../concepts/tail.md) and "
        "[Hybrid SWA](../../concepts/swa.md).\n\n",
        table([*_SHOWN_KINDS, *(r.scenario for r in all_replays)], rows),
        "\n",
    ]
    for rep in all_replays:
        name = f"replay-{rep.scenario}-pool.svg"
        plots.line_chart(
            plot_dir / name,
            _utilisation_series(rep),
            title=f"KV pool in use after each round: {rep.scenario}",
            ylabel="pool in use (%)",
        )
        parts.append(f"![KV pool utilisation per round, {rep.scenario}](plots/{name})\n\n")
    return "".join(parts)


# --- harness ------------------------------------------------------------------------------------
def _fmt(value: float | None, scale: float = 1.0, digits: int = 1, pct: bool = False) -> str:
    if value is None:
        return "—"
    if pct:
        return f"{100 * value:.{digits}f}%"
    return f"{value * scale:,.{digits}f}"


def bench_section(bench: BenchResults, plot_dir: Path) -> str:
    rows = []
    for r in bench.runs:
        crash = "—" if r.crashed_at_round is None else f"**round {r.crashed_at_round}**"
        rows.append(
            [
                *_combo_cells(r.combo),
                "—" if r.completed is None else r.completed,
                crash,
                _fmt(r.tokens_per_s, digits=0),
                _fmt(r.ttft_p50_s, 1000),
                _fmt(r.ttft_p99_s, 1000),
                _fmt(r.peak_pool_use, pct=True),
                _fmt(r.scheduler_share, digits=2, pct=True),
                _fmt(r.mfu, pct=True),
            ]
        )
    headers = [
        *_SHOWN_KINDS,
        "completed",
        "crashed at",
        "tokens/s",
        "TTFT p50 (ms)",
        "TTFT p99 (ms)",
        "peak pool use",
        "scheduler share",
        "MFU",
    ]
    slug = re.sub(r"[^a-z0-9]+", "-", bench.workload.lower()).strip("-")
    labels = [short_label(r.combo) for r in bench.runs]
    crashed = [r.crashed_at_round is not None for r in bench.runs]
    throughput = plots.bar_chart(
        plot_dir / f"bench-{slug}-throughput.svg",
        labels,
        [r.tokens_per_s for r in bench.runs],
        title=f"Prompt throughput, {bench.workload} (red: crashed)",
        xlabel="prompt tokens per second",
        crashed=crashed,
    )
    ttft = plots.paired_bar_chart(
        plot_dir / f"bench-{slug}-ttft.svg",
        labels,
        [None if r.ttft_p50_s is None else 1000 * r.ttft_p50_s for r in bench.runs],
        [None if r.ttft_p99_s is None else 1000 * r.ttft_p99_s for r in bench.runs],
        names=("p50", "p99"),
        title=f"Time to first token, {bench.workload}",
        xlabel="milliseconds",
    )
    parts = [
        f"### Workload `{esc(bench.workload)}`\n\n",
        bench.provenance.note(),
        f"From `{bench.source.name}`. A crashed combination ran out of memory in the round "
        "shown, like a real engine would; its other figures cover the rounds before.\n\n",
        table(headers, rows, right=tuple(range(3, len(headers)))),
        "\n",
        f"![Prompt throughput per combination, {bench.workload}](plots/{throughput.name})\n\n",
        f"![TTFT p50 and p99 per combination, {bench.workload}](plots/{ttft.name})\n\n",
    ]
    series = [
        (short_label(r.combo), list(r.pool_use_by_round)) for r in bench.runs if r.pool_use_by_round
    ]
    if series:
        pool = plots.line_chart(
            plot_dir / f"bench-{slug}-pool.svg",
            series,
            title=f"KV pool in use per round, {bench.workload}",
            ylabel="pool in use (%)",
        )
        parts.append(f"![KV pool utilisation per round, {bench.workload}](plots/{pool.name})\n\n")
    return "".join(parts)


# --- the page -----------------------------------------------------------------------------------
def write_comparisons(registry: PolicyRegistry, results: list[Results], out: Path) -> list[Path]:
    """Write ``out/comparisons/index.md``, its plots and one page per violation trace."""
    folder = out / "comparisons"
    plot_dir, trace_dir = folder / "plots", folder / "traces"
    for d in (plot_dir, trace_dir):
        d.mkdir(parents=True, exist_ok=True)
    combos = registered_combos(registry)
    checks = [r for r in results if isinstance(r, CheckResults)]
    benches = [r for r in results if isinstance(r, BenchResults)]
    written: list[Path] = []
    parts = [
        GENERATED_BANNER,
        "# Comparisons\n\n",
        f"{len(combos)} registered combinations (admission × chunking × alignment; allocator "
        "phase at its default), side by side. Every figure below comes from a run: a results "
        "file of `policykit check` or `policykit bench`, or a scheduler replay made while "
        "building this page. How the files look: [Results files](../../results-format.md).\n\n",
    ]
    if checks:
        for check in checks:
            parts.append(check_section(check, combos))
            for v in check.verdicts:
                if v.verdict == "violated":
                    path = trace_dir / f"{trace_slug(v)}.md"
                    path.write_text(trace_page(v, registry, check.provenance), encoding="utf-8")
                    written.append(path)
    else:
        parts.append(
            '## Formal verdicts\n\n!!! note "No `policykit check` results"\n    None were given '
            "to `policykit docs` and the `check` command is not available here, so there is no "
            "verdict matrix yet.\n\n"
        )
    parts.append(replay_section(replay_all(registry, combos), combos, plot_dir))
    parts.append("## Harness\n\n")
    if benches:
        parts.extend(bench_section(b, plot_dir) for b in benches)
    else:
        parts.append(
            '!!! note "No `policykit bench` results"\n    None were given to `policykit docs` '
            "and the `bench` command is not available here.\n\n"
        )
    index = folder / "index.md"
    index.write_text("".join(parts), encoding="utf-8")
    written.append(index)
    written.extend(sorted(plot_dir.glob("*.svg")))
    return written
