"""Benchmark: one planning round, policykit against SGLang 0.5.23's real ``PrefillAdder``, in the
same process, with 1, 64 and 4096 waiting requests.

Run with ``pytest tests/upstream/test_bench_upstream.py --benchmark-enable`` (skipped without
the ``sglang`` extra). Both sides plan the same round of the same node and allocate nothing: the
upstream side is :meth:`UpstreamDriver.round` (a ``PrefillAdder``, ``add_one_req`` per request,
and the same plan record policykit builds).
"""

from __future__ import annotations

import importlib.util

import pytest

from policykit.planner import Planner
from policykit.scenario import parse_scenario

if importlib.util.find_spec("sglang") is None:
    pytest.skip("the policykit[sglang] extra is not installed", allow_module_level=True)

from policykit.conformance.sglang.compare import UPSTREAM_COMBO
from policykit.conformance.sglang.driver import UpstreamDriver

pytestmark = pytest.mark.usefixtures("upstream")


def waiting_scenario(n: int):
    return parse_scenario(
        {
            "page_size": 64,
            "chunked_prefill_size": 8192,
            "pool": {"free_tokens": 64 * 16384, "evictable_tokens": 0},
            "requests": [{"id": f"r{i}", "prompt_tokens": 1000 + i % 97} for i in range(n)],
        }
    )


@pytest.mark.parametrize("waiting", [1, 64, 4096])
def test_plan_round_policykit(benchmark, registry, waiting):
    driver = UpstreamDriver(waiting_scenario(waiting))  # same node layout as upstream's run
    node = driver.node
    node.arrive(1)
    planner = Planner(node, registry.resolve(UPSTREAM_COMBO, config=node.config))
    plan = benchmark(planner.plan, 1)
    assert plan.batch


@pytest.mark.parametrize("waiting", [1, 64, 4096])
def test_plan_round_upstream(benchmark, waiting):
    driver = UpstreamDriver(waiting_scenario(waiting))
    driver.node.arrive(1)
    driver.enqueue()
    record = benchmark(driver.round, 1)
    assert record.plan.batch
