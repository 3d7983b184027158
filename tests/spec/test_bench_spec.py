"""Benchmarks of ``policykit check`` (run with ``--benchmark-enable``; no timing asserts)."""

from __future__ import annotations

import json

import pytest
from click.testing import CliRunner

from policykit.cli import main
from policykit.cli.common import load_registry
from policykit.config import EngineConfig
from policykit.spec.checker import CheckOptions, check_combo, combo_label

CONFIG = EngineConfig(page_size=64, chunked_prefill_size=4096)


def _enabled(benchmark) -> None:
    if benchmark.disabled:
        pytest.skip("a benchmark: run with --benchmark-enable")


@pytest.mark.parametrize("shrink", [False, True], ids=["found", "found-and-shrunk"])
def test_bench_seed_000_counterexample(benchmark, registry, shrink) -> None:
    """The seed 000 counterexample: found (induction attempts, then BMC to round 3), and found
    then shrunk (replaying smaller candidates, at most ``REPLAY_BUDGET`` of them)."""
    _enabled(benchmark)
    combo = registry.resolve("admission=sglang,chunking=sglang,alignment=checkpoint:256")
    options = CheckOptions(rounds=4, requests=3, properties=("no-oom",), shrink=shrink)
    verdicts = benchmark.pedantic(
        check_combo, args=(combo, CONFIG, options), rounds=3, iterations=1
    )
    assert verdicts[0].verdict == "violated"


def test_bench_check_all_builtins(benchmark) -> None:
    """``policykit check --all`` as a user runs it (combos in parallel, one per core)."""
    _enabled(benchmark)

    def run():
        return CliRunner().invoke(main, ["check", "--all", "--json"])

    out = benchmark.pedantic(run, rounds=1, iterations=1)
    assert out.exit_code == 1  # seed 000 and its relatives are violated
    _, registry = load_registry()
    expected = {combo_label(c) for c in registry.all_combos(EngineConfig(64, 4096))}
    checked = json.loads(out.stdout)["verdicts"]
    assert {v["combo"] for v in checked} == expected
    assert len(checked) == 6 * len(expected)  # six properties without hybrid SWA


def test_bench_cross_validation_of_the_builtins(benchmark, registry) -> None:
    """What cross-validation adds to ``check --all``: every built-in combo's policies lifted
    and compared with Python on their concrete views, from an empty cache (a new z3 context
    each round, as a fresh worker process starts)."""
    _enabled(benchmark)
    import z3

    from policykit.spec.crossval import check_policies

    engine = EngineConfig(64, 4096)
    combos = list(registry.all_combos(engine))

    def run() -> None:
        z3.z3._main_ctx = z3.Context()
        for combo in combos:
            check_policies(combo, engine)

    benchmark.pedantic(run, rounds=3, iterations=1)
