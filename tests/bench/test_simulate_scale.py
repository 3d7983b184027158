"""Benchmark: what one request costs ``policykit simulate`` at 12k requests against 1k
(issue 35: at most 1.5x, and flat is better). Measure with::

    pytest tests/bench/test_simulate_scale.py --benchmark-enable -s

Each round runs the command in process, as a user runs it minus the interpreter's start-up
(read the scenario file, run it, print the JSON document or the table), on 1k and then 12k
requests of :func:`~tests.core.scale_scenario.scale_scenario`, and takes each one's CPU time:
the machine is shared, and wall time counts the other processes too. The ratio is
``(12k time / 12000) / (1k time / 1000)`` over each size's fastest round; it is printed and kept
in the extra info (``--benchmark-json``). Nothing asserts on it: a timed assertion fails on a
loaded machine, not on a slow change. Without ``--benchmark-enable`` (the project's default)
each mode runs once on 1/40 of the requests: a plain, fast test of the same path.
"""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest
from click.testing import CliRunner

from policykit.cli import main
from tests.core.scale_scenario import COMBO, scale_scenario

SIZES = (1000, 12000)


@pytest.mark.parametrize("mode", ["json", "text"])
def test_simulate_cost_per_request_12k_over_1k(benchmark, tmp_path: Path, mode: str) -> None:
    sizes = [n // 40 for n in SIZES] if benchmark.disabled else list(SIZES)
    files = {}
    for n in sizes:
        files[n] = tmp_path / f"scale-{n}.json"
        files[n].write_text(json.dumps(scale_scenario(n)))
    flags = ["--json"] if mode == "json" else []
    runner = CliRunner(env={"COLUMNS": "120"})
    fastest = dict.fromkeys(sizes, float("inf"))

    def both() -> None:
        for n in sizes:
            t0 = time.process_time()
            out = runner.invoke(main, ["simulate", str(files[n]), "--combo", COMBO, *flags])
            fastest[n] = min(fastest[n], time.process_time() - t0)
            assert out.exit_code == 0, out.output
            if mode == "json":
                assert len(json.loads(out.stdout)["completed"]) == n

    runner.invoke(main, ["simulate", str(files[sizes[0]]), "--json"])  # plugins, imports
    benchmark.pedantic(both, rounds=1 if benchmark.disabled else 3, iterations=1)
    small, large = sizes
    per_request = {n: fastest[n] / n * 1e6 for n in sizes}
    ratio = per_request[large] / per_request[small]
    benchmark.extra_info.update({f"us_per_request_{n}": per_request[n] for n in sizes})
    benchmark.extra_info["ratio"] = ratio
    if not benchmark.disabled:
        print(
            f"\nsimulate ({mode}): {per_request[small]:.0f} us/request at {small}, "
            f"{per_request[large]:.0f} at {large}: {ratio:.2f}x per request"
        )
