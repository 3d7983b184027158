"""The harness section of the comparison page: outcomes first, predicted time, then measured.

Order matters. The scheduler's *outcomes* (rounds, tokens, pool use, crashes) are the same on
every machine and say what a policy decides; they lead. *Predicted* time prices that schedule
on a named GPU with the roofline model of :mod:`policykit.harness.roofline`. *Measured*
wall-clock time on the machine that built the page comes last, as median and range over
repeats, and two combinations are only called different when their ranges do not overlap.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import Any

from policykit.docsgen import plots
from policykit.docsgen.labels import short_label
from policykit.docsgen.markdown import EVERY_PAGE, Links, esc, table
from policykit.docsgen.results import BenchResults, BenchRun
from policykit.harness.metrics import distinct
from policykit.registry import COMBO_SEPARATOR

#: the GPU whose predictions the charts show (the tables show every preset)
CHART_GPU = "H200"
#: the page these sections are written into, relative to the docs folder
PAGE = "generated/comparisons/index.md"
#: fewer repeats than this give no spread worth comparing
MIN_REPEATS = 3


def _num(value: Any, digits: int = 0, scale: float = 1.0) -> str:
    if value is None or isinstance(value, bool) or not isinstance(value, int | float):
        return "—"
    return f"{value * scale:,.{digits}f}"


def _pct(value: Any) -> str:
    return "—" if not isinstance(value, int | float) else f"{100 * value:.0f}%"


def _label(r: BenchRun) -> str:
    """The combination's printed form as separate code spans with a line-break opportunity
    after each separator, so a narrow column wraps between policies (it copies unchanged)."""
    parts = short_label(r.combo).split(COMBO_SEPARATOR)
    return f"{COMBO_SEPARATOR}<wbr>".join(f"`{part}`" for part in parts)


def _status(r: BenchRun) -> str:
    """How the run ended, with the requests that did not complete (when any)."""
    if r.crashed:
        return f"**✗ crashed in round {r.crashed_at_round}**"
    req = r.outcomes.get("requests", {})
    total = req.get("total")
    done = r.completed if r.completed is not None else req.get("completed")
    if done is None:
        return "—"
    text = f"{done}/{total} done" if total else f"{done} done"
    lost = [f"{req[k]} {k}" for k in ("rejected", "starved", "failed") if req.get(k)]
    return text + (f", {', '.join(lost)}" if lost else "")


def outcomes_table(bench: BenchResults) -> str:
    rows = []
    for r in bench.runs:
        o = r.outcomes
        ttft = o.get("ttft_rounds", {})
        pool = o.get("pool_use", {})
        rows.append(
            [
                _label(r),
                _status(r),
                _num(o.get("rounds", r.rounds)),
                f"{_num(ttft.get('p50'), 1)} / {_num(ttft.get('p99'), 1)}",
                _num(o.get("computed_tokens")),
                _num(o.get("recomputed_tokens")),
                _num(o.get("load_back_tokens")),
                f"{_pct(pool.get('peak', r.peak_pool_use))} / {_pct(pool.get('mean'))}",
            ]
        )
    headers = [
        "combination",
        "outcome",
        "rounds",
        "TTFT (rounds) p50 / p99",
        "computed",
        "recomputed",
        "loaded back",
        "pool peak / mean",
    ]
    return table(headers, rows, right=tuple(range(2, len(headers))))


def predicted_table(bench: BenchResults, gpus: Sequence[str]) -> str:
    rows = []
    for r in bench.runs:
        cells = [_label(r)]
        for gpu in gpus:
            p = r.predicted.get("gpus", {}).get(gpu, {})
            if r.crashed:
                cells += ["crashed", "—"]
            else:
                cells += [
                    _num(p.get("prompt_tokens_per_s")),
                    _num((p.get("ttft_s") or {}).get("p50"), 2, 1000),
                ]
        rows.append(cells)
    headers = ["combination"]
    for gpu in gpus:
        headers += [f"{gpu} tok/s", f"{gpu} TTFT p50 ms"]
    return table(headers, rows, right=tuple(range(1, len(headers))))


def _spread_text(s: dict[str, Any] | None, digits: int = 0, scale: float = 1.0) -> str:
    if not s:
        return "—"
    return (
        f"{_num(s['median'], digits, scale)} "
        f"({_num(s['min'], digits, scale)}–{_num(s['max'], digits, scale)})"
    )


def measured_table(bench: BenchResults) -> tuple[str, int]:
    """Median (range) per combination, and a verdict against the fastest that never calls a
    difference inside the noise a difference. Returns the table and the repeat count."""
    repeats = min((r.wall.get("repeats", 1) for r in bench.runs), default=1)
    alive = [r for r in bench.runs if not r.crashed and r.wall.get("prompt_tokens_per_s")]
    fastest = max(alive, key=lambda r: r.wall["prompt_tokens_per_s"]["median"], default=None)
    rows = []
    for r in bench.runs:
        tput = r.wall.get("prompt_tokens_per_s")
        if r.crashed:
            verdict = "crashed: not compared"
        elif repeats < MIN_REPEATS or fastest is None or tput is None:
            verdict = f"not compared (fewer than {MIN_REPEATS} repeats)"
        elif r is fastest:
            verdict = "fastest median"
        elif r.outcomes and r.outcomes == fastest.outcomes:
            verdict = "same outcomes as the fastest: the gap is noise, not policy"
        elif distinct(tput, fastest.wall["prompt_tokens_per_s"]):
            verdict = "slower than the fastest, beyond noise"
        else:
            verdict = "same as the fastest within noise"
        rows.append(
            [
                _label(r),
                _spread_text(tput) if tput else _num(r.tokens_per_s),
                _spread_text(r.wall.get("ttft_p50_s"), 1, 1000)
                if r.wall
                else _num(r.ttft_p50_s, 1, 1000),
                verdict,
            ]
        )
    headers = ["combination", "prompt tok/s, median (range)", "TTFT p50 ms, median (range)", ""]
    return table(headers, rows, right=(1, 2)), repeats


def _charts(bench: BenchResults, plot_dir, slug: str) -> list[str]:
    labels = [short_label(r.combo) for r in bench.runs]
    crashed = [r.crashed_at_round for r in bench.runs]
    predicted = any(r.predicted.get("gpus") for r in bench.runs)
    if predicted:
        gpu = CHART_GPU
        model = next(r.predicted.get("model") for r in bench.runs if r.predicted)
        tput = [
            r.predicted.get("gpus", {}).get(gpu, {}).get("prompt_tokens_per_s") for r in bench.runs
        ]
        ttft = [(r.predicted.get("gpus", {}).get(gpu, {}).get("ttft_s") or {}) for r in bench.runs]
        p50 = [None if t.get("p50") is None else 1000 * t["p50"] for t in ttft]
        p99 = [None if t.get("p99") is None else 1000 * t["p99"] for t in ttft]
        what = f"predicted for {model} on {gpu}"
    else:
        tput = [r.tokens_per_s for r in bench.runs]
        p50 = [None if r.ttft_p50_s is None else 1000 * r.ttft_p50_s for r in bench.runs]
        p99 = [None if r.ttft_p99_s is None else 1000 * r.ttft_p99_s for r in bench.runs]
        what = "measured, one run"
    bars = plots.bar_chart(
        plot_dir / f"bench-{slug}-throughput.svg",
        labels,
        tput,
        title=f"Prompt throughput ({what}), {bench.workload}",
        xlabel="prompt tokens per second",
        crashed=crashed,
    )
    ttft_chart = plots.paired_bar_chart(
        plot_dir / f"bench-{slug}-ttft.svg",
        labels,
        p50,
        p99,
        names=("p50", "p99"),
        title=f"Time to first token ({what}), {bench.workload}",
        xlabel="milliseconds",
        crashed=crashed,
    )
    out = [
        f"![Prompt throughput per combination ({what}), {bench.workload}](plots/{bars.name})\n\n",
        f"![TTFT p50 and p99 per combination ({what}), {bench.workload}]"
        f"(plots/{ttft_chart.name})\n\n",
    ]
    runs = [
        (label, r.pool_use_by_round, r.crashed_at_round)
        for label, r in zip(labels, bench.runs, strict=True)
        if r.pool_use_by_round
    ]
    if runs:
        pool = plots.pool_small_multiples(
            plot_dir / f"bench-{slug}-pool.svg",
            plots.group_trajectories(runs),
            title=f"KV pool in use per round, {bench.workload} (the most different runs)",
        )
        out.append(f"![KV pool utilisation per round, {bench.workload}](plots/{pool.name})\n\n")
    return out


def bench_section(bench: BenchResults, plot_dir, links: Links = EVERY_PAGE) -> str:
    slug = re.sub(r"[^a-z0-9]+", "-", bench.workload.lower()).strip("-")
    parts = [
        f"### Workload `{esc(bench.workload)}`\n\n",
        bench.provenance.note(),
        f"From `{bench.source.name}`. A crashed combination ran out of memory in the round "
        "shown, as a real engine would; it is marked in every table and chart and never "
        "ranked, because its figures cover only the rounds before the crash.\n\n",
        "#### Outcomes (the same on every machine)\n\n",
        "What the scheduler decided, counted in rounds and tokens: identical on every run and "
        "every machine. TTFT in rounds counts the arrival round and the round of the first "
        "token; *computed*, *recomputed* and *loaded back* are prompt tokens (recomputed: "
        "whole pages whose prefix this run had already computed; loaded back: copied from "
        "the host tier).\n\n",
        outcomes_table(bench),
        "\n",
    ]
    gpus = list(dict.fromkeys(g for r in bench.runs for g in r.predicted.get("gpus", {})))
    if gpus:
        model = next(r.predicted.get("model") for r in bench.runs if r.predicted)
        parts += [
            f"#### Predicted time for `{esc(model)}` (roofline, not measured)\n\n",
            "Each round's FLOPs and HBM bytes priced on the GPU's dense bf16 peak and memory "
            "bandwidth, the slower term winning (see "
            + links.to("Harness", "harness.md", page=PAGE, anchor="predicted-time")
            + "). "
            "These are **predicted** figures of this schedule, not measurements.\n\n",
            predicted_table(bench, gpus),
            "\n",
        ]
    measured, repeats = measured_table(bench)
    parts += [
        f"#### Measured on {esc(bench.provenance.device)} ({repeats} "
        f"run{'s' if repeats != 1 else ''} each)\n\n",
        "Wall-clock time of the model that ran, median and range over the repeats (run "
        "interleaved: every combination once, then again). A shared machine is noisy: a "
        "combination is only called slower when its range and the fastest one's do not "
        "overlap, and never when it computed exactly what the fastest did (same outcomes).\n\n",
        measured,
        "\n",
    ]
    parts += _charts(bench, plot_dir, slug)
    return "".join(parts)
