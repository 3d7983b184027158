"""Benchmark: one SGLang planning round (the real ``PrefillAdder``) with and without the plugin.

Run with ``pytest tests/upstream/test_sglang_plugin_bench.py --benchmark-enable -s``. Both sides
run in the same process, on the same node state: a round that admits 8 requests whole (1000
tokens each under an 8192-token chunk budget), truncates the ninth and stops (with 64 or 4096
waiting: the rest stay queued, as in upstream's loop; with 1, admits it whole). The target is
the plugin at most 1.2x upstream.

``test_plan_one_round`` gives pytest-benchmark's rows, one side after the other. On a shared
machine the load changes between those rows, so ``test_plugin_over_upstream`` measures the
ratio itself: it alternates the two sides every few rounds (swapping the hooked methods in and
out of ``PrefillAdder``) and prints each side's median CPU time per round and their ratio.
"""

from __future__ import annotations

import importlib.util
import statistics
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager, nullcontext

import pytest

if importlib.util.find_spec("sglang") is None:
    pytest.skip("the policykit[sglang] extra is not installed", allow_module_level=True)

from policykit.conformance.sglang.driver import UpstreamDriver, UpstreamUnavailable, load
from policykit.integrations.sglang.plugin import applied, decision_methods, restore
from policykit.registry import registry_from
from policykit.scenario import parse_scenario

COMBO = "admission=reserve-tail,chunking=sglang,alignment=page"
SIZES = [1, 64, 4096]


@pytest.fixture(scope="module", autouse=True)
def _upstream() -> None:
    try:
        load()
    except UpstreamUnavailable as exc:
        pytest.skip(str(exc))


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
    driver.enqueue()
    return driver


@pytest.mark.parametrize("waiting", SIZES)
@pytest.mark.parametrize("side", ["upstream", "plugin"])
def test_plan_one_round(benchmark, waiting, side):
    benchmark.group = f"sglang round, {waiting} waiting"
    combo = registry_from().resolve(COMBO)
    driver = _driver(waiting)
    with applied(combo) if side == "plugin" else nullcontext():
        record = benchmark(driver.round, 1)
    assert record.plan.batch


@contextmanager
def _switch(combo) -> Iterator[Callable[[bool], None]]:
    """A function that puts the plugin's hooks in (True) or upstream's methods back (False)."""
    plain = decision_methods()
    with applied(combo):
        hooked = decision_methods()

        def use(plugin: bool) -> None:
            restore(hooked if plugin else plain)

        try:
            yield use
        finally:
            use(True)  # applied() puts upstream's methods back itself


@pytest.mark.parametrize("waiting", SIZES)
def test_plugin_over_upstream(benchmark, waiting):
    if not benchmark.enabled:
        pytest.skip("a benchmark: run with --benchmark-enable")
    driver = _driver(waiting)
    times: dict[bool, list[float]] = {False: [], True: []}
    blocks, per_block = 400, 5
    with _switch(registry_from().resolve(COMBO)) as use:
        for block in range(blocks):
            for plugin in (block % 2 == 0, block % 2 == 1):
                use(plugin)
                driver.round(1)  # warm the swapped-in methods
                for _ in range(per_block):
                    start = time.thread_time()
                    driver.round(1)
                    times[plugin].append(time.thread_time() - start)
    upstream, plugin = statistics.median(times[False]), statistics.median(times[True])
    print(
        f"\nsglang round, {waiting} waiting: upstream {upstream * 1e6:.1f} us, plugin "
        f"{plugin * 1e6:.1f} us (median CPU time of {blocks * per_block // 2} rounds each, "
        f"interleaved): {plugin / upstream:.3f}x"
    )
