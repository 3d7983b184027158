"""``policykit bench --executor local`` gives the rows an inline run gives, plus where they ran."""

from __future__ import annotations

import json

import pytest
from click.testing import CliRunner

from policykit.cli import main

COMBOS = "admission=sglang,alignment=checkpoint:256;admission=reserve-tail,alignment=checkpoint:256"
OUTCOME = ("combo", "status", "crash", "requests", "rounds", "prompt_tokens_completed", "flops")


def bench(*extra: str) -> dict:
    args = ["bench", "--workload", "host-hit-heavy", "--device", "cpu", "--combos", COMBOS]
    result = CliRunner().invoke(main, [*args, *extra, "--json"])
    assert result.exit_code == 0, result.output
    return json.loads(result.stdout)


@pytest.mark.slow
def test_bench_on_the_local_executor_equals_inline():
    inline = bench()
    pooled = bench("--executor", "local", "--workers", "1")
    assert pooled["executor"]["name"] == "local" and pooled["failed"] == []
    assert [{k: r[k] for k in OUTCOME} for r in pooled["combos"]] == [
        {k: r[k] for k in OUTCOME} for r in inline["combos"]
    ]
    assert all(r["executor"] == "local" and r["node"] for r in pooled["combos"])
    assert pooled["combos"][0]["crash"]["round"] == 5  # the unsafe combo still crashes
