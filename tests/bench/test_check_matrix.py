"""Benchmark: the whole matrix as one gate, ``policykit check --all --matrix`` (page sizes 1, 16,
64, 256, without and with a 4096-token sliding window), as a user runs it (issue 35: under 60 s
on two cores). Measure with::

    pytest tests/bench/test_check_matrix.py --benchmark-enable -s

``cold`` checks every combo (``--no-cache``); ``warm`` runs the same command twice on an empty
verdict cache of its own and measures the second run, which takes every verdict from the cache
(:mod:`policykit.spec.proof_cache`). Both print their wall time and the verdicts must be the
same; nothing asserts on the time (a timed assertion fails on a loaded machine, not on a slow
change; docs/spec.md, "The matrix in a minute", has the figures and the load). Without
``--benchmark-enable`` it is skipped: ``tests/spec/test_proof_cache.py`` tests the same path
on one combo.
"""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest
from click.testing import CliRunner

from policykit.cli import main

MATRIX = ["--all", "--matrix"]


def _claims(doc: dict) -> list[dict]:
    """The rows without their timings: what must not move between a cold and a warm run."""
    return [{k: v for k, v in r.items() if k != "seconds"} for r in doc["verdicts"]]


@pytest.mark.parametrize("mode", ["cold", "warm"])
def test_bench_check_matrix(benchmark, monkeypatch, tmp_path: Path, mode: str) -> None:
    if benchmark.disabled:
        pytest.skip("a benchmark: run with --benchmark-enable")
    monkeypatch.setenv("POLICYKIT_CACHE_DIR", str(tmp_path / "cache"))
    args = ["check", *MATRIX, "--json"]
    runner = CliRunner()
    first = runner.invoke(main, args) if mode == "warm" else None
    flags = ["--no-cache"] if mode == "cold" else []
    took: list[float] = []

    def run():
        t0 = time.perf_counter()
        out = runner.invoke(main, [*args, *flags])
        took.append(time.perf_counter() - t0)
        return out

    out = benchmark.pedantic(run, rounds=1, iterations=1)
    assert out.exit_code in (1, 3), out.output  # the built-ins include violated combos
    doc = json.loads(out.stdout)
    cache = doc["cache"]
    benchmark.extra_info.update({"wall_s": took[0], "cache": cache})
    if mode == "warm":
        assert first is not None
        assert cache["checked"] == 0 and cache["misses"] == 0
        assert _claims(doc) == _claims(json.loads(first.stdout))
    else:
        assert cache["enabled"] is False
    pairs = {(b["page_size"], b["sliding_window"]) for b in doc["configs"]}
    assert pairs == {(p, w) for p in (1, 16, 64, 256) for w in (None, 4096)}
    # sliding-window pools SGLang 0.5.23 refuses to start with are left out
    assert all(
        b["min_swa_pool_tokens"] == b["sliding_window"] + b["page_size"] + 1
        for b in doc["configs"]
        if b["sliding_window"]
    )
    print(f"\ncheck --all --matrix ({mode}): {took[0]:.1f} s wall, {len(doc['verdicts'])} rows")
