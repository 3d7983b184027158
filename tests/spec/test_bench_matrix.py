"""The whole matrix as one gate: ``policykit check --all --matrix`` (page sizes 1, 16, 64, 256,
without and with a 4096-token sliding window), timed as a user runs it. Run with
``--benchmark-enable``; no timing asserts (docs/spec.md's cost table has the figures)."""

from __future__ import annotations

import json

import pytest
from click.testing import CliRunner

from policykit.cli import main


def test_bench_check_all_matrix(benchmark) -> None:
    if benchmark.disabled:
        pytest.skip("a benchmark: run with --benchmark-enable")

    def run():
        return CliRunner().invoke(main, ["check", "--all", "--matrix", "--json"])

    out = benchmark.pedantic(run, rounds=1, iterations=1)
    assert out.exit_code in (1, 3), out.output  # the built-ins include violated combos
    doc = json.loads(out.stdout)
    pairs = {(b["page_size"], b["sliding_window"]) for b in doc["configs"]}
    assert pairs == {(p, w) for p in (1, 16, 64, 256) for w in (None, 4096)}
    # sliding-window pools SGLang 0.5.23 refuses to start with are left out
    assert all(
        b["min_swa_pool_tokens"] == b["sliding_window"] + b["page_size"] + 1
        for b in doc["configs"]
        if b["sliding_window"]
    )
