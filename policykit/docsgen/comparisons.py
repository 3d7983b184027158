"""The comparison pages: combinations side by side.

The page leads with production traces (:mod:`policykit.docsgen.trace_section`): every
combination replayed through real traffic, identical ones grouped, with a load sweep. Then three
sections, each from its own source and each stating where and when it was measured:

* **formal verdicts** from ``policykit check`` results: a summary of which combinations are
  safe for what, then a matrix (admission × queue × chunking by alignment, one mark per
  property),
  every violation linked to its rendered counterexample trace;
* **scenario replays**: every registered combination run through the bundled scenarios by the
  real scheduler (computed here, so the page is never empty of measured behaviour);
* **harness** outcomes, predicted and measured times per workload from ``policykit bench``.
"""

from __future__ import annotations

import html
from dataclasses import dataclass
from pathlib import Path

from policykit.docsgen import plots
from policykit.docsgen.bench_section import bench_section
from policykit.docsgen.concepts import HYBRID_SWA
from policykit.docsgen.conclusion import conclusion
from policykit.docsgen.labels import (
    SHOWN_KINDS,
    combo_cells,
    preempting_combos,
    registered_combos,
    short_label,
    sliding_window_only,
    trace_slug,
)
from policykit.docsgen.markdown import EVERY_PAGE, GENERATED_BANNER, Links, Provenance, table
from policykit.docsgen.replay import Replay, replay, scenario_from
from policykit.docsgen.results import (
    BenchResults,
    CheckResults,
    Results,
    TraceBenchResults,
    TraceSweepResults,
    now_utc,
)
from policykit.docsgen.trace_section import trace_section
from policykit.docsgen.traces import trace_page
from policykit.docsgen.verdict_matrix import check_section, verdict_cell
from policykit.errors import PolicykitError
from policykit.registry import PolicyRegistry

#: scenarios every combination is replayed through
REPLAY_SCENARIOS: tuple[str, ...] = ("seed-abc", "seed-incident-1keim", str(HYBRID_SWA))
#: this page, relative to the docs folder (for links to hand-written pages)
PAGE = "generated/comparisons/index.md"
#: front matter: the page is its tables, which need the width Material gives the table of
#: contents on a 1280 px screen (tests/docs/test_browser.py checks that nothing scrolls)
NO_TOC = "---\nhide:\n  - toc\n---\n\n"
#: the names other modules and tests reach through this one
__all__ = [
    "REPLAY_SCENARIOS",
    "combo_cells",
    "preempting_combos",
    "registered_combos",
    "short_label",
    "trace_slug",
    "verdict_cell",
    "write_comparisons",
]


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
                why = html.escape(" ".join(str(exc).split()), quote=True)
                runs[combo] = f'<span title="{why}">not supported here</span>'
        out.append(ScenarioReplays(scenario.name, runs))
    return out


def _trajectories(replays: ScenarioReplays) -> list[plots.Trajectory]:
    """One trajectory per distinct run; combinations that behave alike share it."""
    runs = [
        (
            short_label(combo),
            run.pool_use_by_round,
            None if run.result.oom is None else run.result.oom.round,
        )
        for combo, run in replays.runs.items()
        if isinstance(run, Replay)
    ]
    return plots.group_trajectories(runs)


def replay_section(
    all_replays: list[ScenarioReplays], combos: list[str], plot_dir: Path, links: Links
) -> str:
    provenance = Provenance(
        device="CPU (torch tensors; scheduler only, no model)",
        model=None,
        date=now_utc(),
        produced_by="`policykit docs` replaying the bundled scenarios through the scheduler",
    )
    rows = []
    for combo in combos:
        cells = combo_cells(combo)
        for rep in all_replays:
            run = rep.runs[combo]
            if isinstance(run, Replay):
                cells.append(run.cell)
            else:
                cells.append(run)
        rows.append(cells)
    parts = [
        "## Scenario replays\n\n",
        provenance.note(),
        "Every registered combination run through each scenario until nothing can change "
        "(`policykit simulate SCENARIO --combo ...`). The scenarios are explained on "
        + links.to("The tail and the alignment gap", "concepts/tail.md", page=PAGE)
        + " and "
        + links.to("Hybrid SWA", "concepts/swa.md", page=PAGE)
        + ".\n\n",
        table([*SHOWN_KINDS, *(r.scenario for r in all_replays)], rows),
        "\n",
    ]
    for rep in all_replays:
        name = f"replay-{rep.scenario}-pool.svg"
        plots.pool_small_multiples(
            plot_dir / name,
            _trajectories(rep),
            title=f"KV pool in use after each round: {rep.scenario}",
        )
        parts.append(f"![KV pool utilisation per round, {rep.scenario}](plots/{name})\n\n")
    return "".join(parts)


# --- the page -----------------------------------------------------------------------------------
def write_comparisons(
    registry: PolicyRegistry, results: list[Results], out: Path, links: Links = EVERY_PAGE
) -> list[Path]:
    """Write ``out/comparisons/index.md``, its plots and one page per violation trace."""
    folder = out / "comparisons"
    plot_dir, trace_dir = folder / "plots", folder / "traces"
    for d in (plot_dir, trace_dir):
        d.mkdir(parents=True, exist_ok=True)
    combos = registered_combos(registry)
    checks = [r for r in results if isinstance(r, CheckResults)]
    benches = [r for r in results if isinstance(r, BenchResults)]
    traces = [r for r in results if isinstance(r, TraceBenchResults)]
    sweeps = {r.trace.get("name"): r for r in results if isinstance(r, TraceSweepResults)}
    written: list[Path] = []
    parts = [
        NO_TOC,
        GENERATED_BANNER,
        "# Comparisons\n\n",
        conclusion(traces, checks),
        f"{len(combos)} registered combinations (admission × chunking × alignment × queue, the "
        "kinds that change a verdict; the allocator phase, which no verdict depends on, at its "
        "default), side by side, and in the formal verdicts the combinations that preempt "
        "(vLLM's node, checked but not benched). Every figure below comes from a run: a results "
        "file of `policykit check` or `policykit bench`, or a scheduler replay made while "
        "building this page. How the files look: "
        + links.to("Results files", "results-format.md", page=PAGE)
        + ".\n\n",
    ]
    for bench in traces:
        parts.append(trace_section(bench, sweeps.get(bench.trace.get("name")), plot_dir, links))
    if checks:
        for check in checks:
            checked = {v.combo for v in check.verdicts}
            preempting = [c for c in preempting_combos(registry) if c in checked]
            parts.append(check_section(check, [*combos, *preempting]))
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
    # and the combinations that only run with a sliding window, for the hybrid-SWA scenario
    shown = [*combos, *sliding_window_only(registry)]
    parts.append(replay_section(replay_all(registry, shown), shown, plot_dir, links))
    parts.append("## Harness\n\n")
    if benches:
        parts.extend(bench_section(b, plot_dir, links) for b in benches)
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
