"""Benchmark: one planning round with 1, 64 and 4096 waiting requests.

Run with ``pytest tests/core/test_bench_planner.py --benchmark-enable``. The round stops at the
first request the budget refuses, so its cost must not grow with the queue behind it.
"""

from __future__ import annotations

import pytest

from policykit.planner import Planner
from policykit.scenario import build_node, parse_scenario


def waiting_node(n: int):
    sc = parse_scenario(
        {
            "page_size": 64,
            "chunked_prefill_size": 8192,
            "pool": {"free_tokens": 64 * 16384, "evictable_tokens": 0},
            "requests": [{"id": f"r{i}", "prompt_tokens": 1000 + i % 97} for i in range(n)],
        }
    )
    node = build_node(sc)
    node.arrive(0)
    return node


@pytest.mark.parametrize("waiting", [1, 64, 4096])
def test_plan_one_round(benchmark, registry, waiting):
    node = waiting_node(waiting)
    planner = Planner(node, registry.resolve("admission=reserve-tail,alignment=checkpoint:256"))
    plan = benchmark(planner.plan, 1)
    assert plan.batch  # something was admitted
    assert len(plan.entries) + len(plan.rejected) <= 9  # 8 fit the 8192-token budget
