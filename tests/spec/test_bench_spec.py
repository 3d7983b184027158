"""Benchmarks of ``policykit check`` (run with ``--benchmark-enable``; no timing asserts)."""

from __future__ import annotations

import pytest
from policykit.spec.checker import CheckOptions, check_combo
from policykit.spec.model import ModelConfig

from policykit.policy import EngineConfig

CONFIG = ModelConfig(page_size=64, chunked_prefill_size=4096)


def _enabled(benchmark) -> None:
    if benchmark.disabled:
        pytest.skip("a benchmark: run with --benchmark-enable")


def test_bench_seed_000_counterexample(benchmark, registry) -> None:
    _enabled(benchmark)
    combo = registry.resolve("admission=sglang,chunking=sglang,alignment=checkpoint:256")
    options = CheckOptions(rounds=4, requests=3, properties=("no-oom",))
    verdicts = benchmark.pedantic(
        check_combo, args=(combo, CONFIG, options), rounds=1, iterations=1
    )
    assert verdicts[0].verdict == "violated"


def test_bench_all_builtin_combos(benchmark, registry) -> None:
    _enabled(benchmark)
    combos = list(registry.all_combos(EngineConfig(64, 4096)))
    options = CheckOptions(rounds=4, requests=3, timeout_s=10.0)

    def run() -> list:
        return [v for c in combos for v in check_combo(c, CONFIG, options)]

    verdicts = benchmark.pedantic(run, rounds=1, iterations=1)
    assert len(verdicts) == 5 * len(combos)
