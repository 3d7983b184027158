"""Deterministic outcomes, roofline predictions and repeated timings of a bench run."""

from __future__ import annotations

import pytest

from policykit.harness.metrics import distinct, spread
from policykit.harness.presets import get_preset
from policykit.harness.roofline import GPUS, RoundCost, get_gpu, round_cost
from policykit.harness.runner import from_workload, run_bench
from policykit.harness.workloads import RequestSpec, Workload, generate, workload_config
from policykit.plan import Entry, EntryKind

COMBOS = (
    "admission=sglang,chunking=sglang,alignment=page",
    "admission=reserve-tail,chunking=sglang,alignment=truncation:192",
)


def _deterministic(doc: dict) -> list[dict]:
    return [{"outcomes": r["outcomes"], "predicted": r["predicted"]} for r in doc["combos"]]


def test_the_same_bench_twice_gives_identical_outcomes_and_predictions(
    tiny, registry, coverage_workload
):
    bench = from_workload(coverage_workload)
    combos = [registry.resolve(c, config=bench.config) for c in COMBOS]
    first = run_bench(bench, combos, tiny, repeats=3)
    second = run_bench(bench, combos, tiny, repeats=1)
    assert _deterministic(first) == _deterministic(second)
    for row in first["combos"]:
        assert row["outcomes_repeatable"] is True
        wall = row["wall"]
        assert wall["repeats"] == 3 and len(wall["wall_seconds"]["samples"]) == 3
        assert wall["wall_seconds"]["min"] <= wall["wall_seconds"]["median"]
        assert wall["wall_seconds"]["median"] <= wall["wall_seconds"]["max"]
        out = row["outcomes"]
        assert out["rounds"] == row["rounds"]
        assert out["requests"]["completed"] == row["requests"]["completed"]
        assert 0 < out["pool_use"]["mean"] <= out["pool_use"]["peak"] <= 1
        assert out["computed_tokens"] > 0
        assert out["load_back_tokens"] > 0  # the coverage workload loads from the host tier
        assert set(row["predicted"]["gpus"]) == set(GPUS)
    assert first["created"]


def test_ttft_and_completion_are_counted_in_rounds(tiny, registry):
    """host-hit-heavy at a small pool under the default combo: every request arrives in round
    1, so a request's TTFT in rounds equals the round it finished in."""
    bench = from_workload(generate("host-hit-heavy", 2048))
    doc = run_bench(bench, [registry.resolve(None, config=bench.config)], tiny)
    out = doc["combos"][0]["outcomes"]
    assert out["completion_round"]["max"] <= out["rounds"]
    assert out["ttft_rounds"]["p50"] >= 1


def test_a_prefix_computed_twice_counts_as_recomputed(tiny, registry):
    """Two requests arrive together sharing a 192-token prefix that is nowhere resident: both
    compute it in the same round, so the second one's three whole pages are recomputed."""
    twins = Workload(
        name="twins",
        description="a shared prefix computed twice",
        pool_tokens=1024,
        config=workload_config(512, kv_release_rounds=1),
        requests=(
            RequestSpec("a", 200, 1, prefix_group="p", prefix_tokens=192),
            RequestSpec("b", 200, 1, prefix_group="p", prefix_tokens=192),
            RequestSpec("solo", 300, 1),
        ),
    )
    bench = from_workload(twins)
    doc = run_bench(bench, [registry.resolve(None, config=bench.config)], tiny)
    out = doc["combos"][0]["outcomes"]
    assert out["recomputed_tokens"] == 192
    assert out["computed_tokens"] == 700


def test_roofline_takes_the_slower_of_compute_and_memory():
    h200 = get_gpu("h200")
    compute_bound = RoundCost(flops=int(989e12), hbm_bytes=1)
    memory_bound = RoundCost(flops=1, hbm_bytes=int(4.8e12))
    assert compute_bound.seconds(h200) == pytest.approx(1.0)
    assert memory_bound.seconds(h200) == pytest.approx(1.0)
    big = get_preset("llama3-8b")
    long_chunk = round_cost([Entry("a", 0, 8192, EntryKind.WHOLE)], big)
    one_token = round_cost([Entry("a", 100, 101, EntryKind.FINAL)], big)
    # an 8k-token prefill is compute-bound, a one-token chunk is bound by reading the weights
    assert long_chunk.flops / h200.peak_flops > long_chunk.hbm_bytes / h200.hbm_bytes_per_s
    assert one_token.flops / h200.peak_flops < one_token.hbm_bytes / h200.hbm_bytes_per_s
    assert long_chunk.seconds(get_gpu("B200")) < long_chunk.seconds(h200)
    assert round_cost([], big) == RoundCost(0, 0)


def test_unknown_gpu_is_a_usage_error():
    with pytest.raises(Exception, match="Known GPUs: H100, H200, B200"):
        get_gpu("A100")


def test_timings_differ_only_outside_their_spread():
    a = spread([1.0, 1.2, 1.1])
    b = spread([1.15, 1.4, 1.3])
    c = spread([2.0, 2.1, 2.2])
    assert a["median"] == pytest.approx(1.1)
    assert not distinct(a, b)  # overlapping ranges: same within noise
    assert distinct(a, c)
    assert spread([1.0, None]) is None
