"""Benchmark: one SGLang planning round (the real ``PrefillAdder``) with and without the plugin.

Run with ``pytest tests/upstream/test_sglang_plugin_bench.py --benchmark-enable``; compare the
``upstream`` and ``plugin`` rows of each group (target: the plugin at most 1.2x upstream). Both
run in the same process, on the same node state: a round that admits 8 requests whole (1000
tokens each under an 8192-token chunk budget), truncates the ninth and stops (with 64 or 4096
waiting: the rest stay queued, as in upstream's loop; with 1, admits it whole).
"""

from __future__ import annotations

import importlib.util
from contextlib import nullcontext

import pytest

if importlib.util.find_spec("sglang") is None:
    pytest.skip("the policykit[sglang] extra is not installed", allow_module_level=True)

from policykit.integrations.sglang.plugin import applied
from policykit.registry import registry_from
from policykit.scenario import parse_scenario
from policykit.upstream.sglang import UpstreamDriver, UpstreamUnavailable, load


def _driver(waiting: int) -> UpstreamDriver:
    requests = [{"id": f"r{i}", "prompt_tokens": 1000 + i % 97} for i in range(waiting)]
    scenario = parse_scenario(
        {
            "page_size": 64,
            "chunked_prefill_size": 8192,
            "pool": {"free_tokens": 64 * 16384, "evictable_tokens": 0},
            "requests": requests,
        }
    )
    driver = UpstreamDriver(scenario)
    driver.node.arrive(0)
    return driver


@pytest.mark.parametrize("waiting", [1, 64, 4096])
@pytest.mark.parametrize("side", ["upstream", "plugin"])
def test_plan_one_round(benchmark, waiting, side):
    try:
        load()
    except UpstreamUnavailable as exc:
        pytest.skip(str(exc))
    benchmark.group = f"sglang round, {waiting} waiting"
    combo = registry_from().resolve("admission=reserve-tail,chunking=sglang,alignment=page")
    driver = _driver(waiting)
    with applied(combo) if side == "plugin" else nullcontext():
        record = benchmark(driver.round, 1)
    assert record.plan.batch
