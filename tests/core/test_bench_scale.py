"""Benchmark: a whole ``simulate`` run of 1k, 4k and 12k requests; the cost per request must
stay flat as the run grows (no scan over everything seen so far).

Measure with::

    pytest tests/core/test_bench_scale.py --benchmark-enable --benchmark-timer time.process_time

and compare ``per_request_us`` (in the extra info) across the three sizes. Without
``--benchmark-enable`` (the project's default) each size runs once at 1/40 of its requests:
a plain, fast test of the same path.
"""

from __future__ import annotations

import pytest

from policykit.scenario import build_node, parse_scenario
from policykit.scheduler import Scheduler
from tests.core.scale_scenario import COMBO, scale_scenario


@pytest.mark.parametrize("requests", [1000, 4000, 12000])
def test_simulate_scales_linearly(benchmark, registry, requests):
    n = requests // 40 if benchmark.disabled else requests
    sc = parse_scenario(scale_scenario(n))
    combo = registry.resolve(COMBO, config=sc.config)

    def fresh():
        return (Scheduler(build_node(sc), combo),), {}

    result = benchmark.pedantic(lambda s: s.run(), setup=fresh, rounds=3, iterations=1)
    assert result.oom is None and len(result.completed) == n
    if not benchmark.disabled:
        benchmark.extra_info["per_request_us"] = benchmark.stats.stats.median / n * 1e6
