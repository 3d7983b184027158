"""The comparison charts with 80 combinations: sizes, legends and crash marks."""

from __future__ import annotations

import random
import re
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

from policykit.docsgen import plots
from policykit.docsgen.bench_section import bench_section
from policykit.docsgen.markdown import Provenance
from policykit.docsgen.results import BenchResults, BenchRun

ADMISSIONS = ("sglang", "reserve-tail", "no-evict", "watermark:1024", "margin-tail:2")
CHUNKINGS = ("sglang", "defer", "swa-reserve", "half-budget")
ALIGNMENTS = ("none", "page", "checkpoint:256", "truncation:192")


def _run(i: int, key: str, rng: random.Random) -> BenchRun:
    """A plausible run: pool use ramps up and drains; every seventh one crashes."""
    rounds = rng.randint(8, 60)
    crash = rng.randint(3, rounds) if i % 7 == 0 else None
    peak = rng.uniform(0.4, 0.99)
    use = [min(1.0, peak * min(r / 5, 1) * (1 - r / (rounds * 1.5))) for r in range(rounds)]
    if crash is not None:
        use = [*use[: crash - 1], 1.0]
    predicted = {
        "model": "llama3-8b",
        "gpus": {
            g: {"prompt_tokens_per_s": rng.uniform(1e4, 9e4), "ttft_s": {"p50": 0.1, "p99": 0.4}}
            for g in ("H100", "H200", "B200")
        },
    }
    return BenchRun(
        combo=key,
        completed=40 if crash is None else 10,
        rejected=0,
        pending=0 if crash is None else 30,
        crashed_at_round=crash,
        tokens_per_s=rng.uniform(1e4, 6e4),
        ttft_p50_s=0.05,
        ttft_p99_s=0.2,
        rounds=len(use),
        peak_pool_use=max(use),
        scheduler_share=0.01,
        mfu=None,
        pool_use_by_round=tuple(use),
        outcomes={"rounds": len(use), "crash_round": crash},
        predicted=predicted,
    )


@pytest.fixture(scope="module")
def eighty(tmp_path_factory) -> tuple[BenchResults, Path, str]:
    rng = random.Random(14)
    keys = [
        f"admission={a},chunking={c},alignment={al},allocator-phase=default"
        for a in ADMISSIONS
        for c in CHUNKINGS
        for al in ALIGNMENTS
    ]
    assert len(keys) == 80
    runs = tuple(_run(i, k, rng) for i, k in enumerate(keys))
    bench = BenchResults(
        Provenance("cpu", "tiny", "2026-11-30", "`policykit bench`"),
        "eighty",
        runs,
        Path("bench-80.json"),
    )
    folder = tmp_path_factory.mktemp("plots")
    page = bench_section(bench, folder)
    return bench, folder, page


def _svg_px(path: Path) -> tuple[float, float]:
    root = ET.parse(path).getroot()
    width, height = (float(re.sub("pt$", "", root.get(k))) for k in ("width", "height"))
    return width * 4 / 3, height * 4 / 3  # a CSS pixel is 3/4 of a point


def test_pool_figure_of_80_combinations_fits_1400_px_and_its_legend_the_plot(eighty):
    bench, folder, _ = eighty
    trajectories = plots.group_trajectories(
        [(r.combo, r.pool_use_by_round, r.crashed_at_round) for r in bench.runs]
    )
    layout = plots.pool_small_multiples(folder / "pool.svg", trajectories, title="80 combos")
    width, height = _svg_px(folder / "pool.svg")
    assert width <= 1400 and height <= 1400
    assert layout.width_px <= 1400 and layout.height_px <= 1400
    assert layout.legend_px <= layout.plot_px
    assert width == pytest.approx(layout.width_px, rel=0.02)


def test_every_crashed_combination_is_marked_in_the_pool_figure(eighty):
    bench, folder, _ = eighty
    crashed = sum(r.crashed for r in bench.runs)
    trajectories = plots.group_trajectories(
        [(r.combo, r.pool_use_by_round, r.crashed_at_round) for r in bench.runs]
    )
    plots.pool_small_multiples(folder / "pool.svg", trajectories, title="80 combos")
    texts = [t.text or "" for t in ET.parse(folder / "pool.svg").iter() if t.tag.endswith("text")]
    panels = sum("crashed in round" in t for t in texts)
    summarised = sum(int(m) for t in texts for m in re.findall(r"(\d+) crashed", t))
    assert panels + summarised == crashed > 0
    assert len([t for t in texts if "round" in t]) <= plots.MAX_PANELS + 4


def test_crashed_combinations_get_no_bars_and_a_mark_in_the_bar_charts(eighty):
    bench, folder, page = eighty
    crashed = sum(r.crashed for r in bench.runs)
    for name in ("bench-eighty-throughput.svg", "bench-eighty-ttft.svg"):
        texts = [t.text or "" for t in ET.parse(folder / name).iter() if t.tag.endswith("text")]
        assert sum("crashed in round" in t for t in texts) == crashed, name
    assert "predicted for llama3-8b on H200" in page
    assert page.count("**✗ crashed in round") == crashed  # the outcomes table


def test_measured_times_are_not_compared_without_repeats(eighty):
    _, _, page = eighty
    rows = page.split("#### Measured", 1)[1].split("| --- |", 1)[1]
    assert "slower" not in rows and "fastest median" not in rows
    assert "not compared (fewer than 3 repeats)" in rows


def _timed(combo: str, samples: list[float]) -> BenchRun:
    run = _run(1, combo, random.Random(1))
    s = sorted(samples)
    spread = {"median": s[1], "min": s[0], "max": s[-1], "samples": samples}
    wall = {"repeats": len(samples), "prompt_tokens_per_s": spread}
    return BenchRun(**{**run.__dict__, "wall": wall, "outcomes": {"schedule of": combo}})


def test_a_difference_inside_the_spread_is_called_the_same(tmp_path: Path):
    base = "admission=sglang,chunking=sglang,alignment={},allocator-phase=default"
    runs = (
        _timed(base.format("page"), [50_000, 60_000, 55_000]),
        _timed(base.format("none"), [41_000, 52_000, 45_000]),  # overlaps: same
        _timed(base.format("checkpoint:256"), [20_000, 30_000, 25_000]),  # apart: slower
    )
    bench = BenchResults(Provenance("cpu", "tiny", "d", "b"), "w", runs, Path("b.json"))
    rows = bench_section(bench, tmp_path).split("#### Measured", 1)[1].split("| --- |", 1)[1]
    lines = {line.split("|")[1].strip(): line for line in rows.splitlines() if "|" in line}
    assert "fastest median" in lines["`sglang`/<wbr>`sglang`/<wbr>`page`"]
    assert "same as the fastest within noise" in lines["`sglang`/<wbr>`sglang`/<wbr>`none`"]
    assert (
        "slower than the fastest, beyond noise"
        in lines["`sglang`/<wbr>`sglang`/<wbr>`checkpoint:256`"]
    )


def test_identical_outcomes_are_never_called_a_timing_difference(tmp_path: Path):
    base = "admission=sglang,chunking=sglang,alignment={},allocator-phase=default"
    same = {"rounds": 81, "computed_tokens": 13_348}
    runs = tuple(
        BenchRun(**{**_timed(base.format(a), t).__dict__, "outcomes": same})
        for a, t in (("page", [50_000, 60_000, 55_000]), ("none", [20_000, 30_000, 25_000]))
    )
    bench = BenchResults(Provenance("cpu", "tiny", "d", "b"), "w", runs, Path("b.json"))
    rows = bench_section(bench, tmp_path).split("#### Measured", 1)[1].split("| --- |", 1)[1]
    assert "slower" not in rows
    assert "same outcomes as the fastest: the gap is noise, not policy" in rows


def test_panel_titles_wrap_instead_of_being_cut():
    from policykit.docsgen.plots import TITLE_CHARS, wrap_title

    long = "reserve-tail/swa-reserve/checkpoint:256/default/fcfs-skip (+11 alike)"
    wrapped = wrap_title(long)
    assert wrapped.replace("\n", "") == long and "…" not in wrapped
    assert all(len(line) <= TITLE_CHARS for line in wrapped.splitlines())
    assert wrapped.splitlines()[0].endswith("/")  # broken after a separator
