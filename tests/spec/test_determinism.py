"""Same question, same answer: ``check`` decides within z3 resource units, not seconds.

The combos below gave different verdicts and different exported counterexamples from run to run
when the budget was wall-clock seconds. Here each is checked twice in one process, with wall-clock
safety nets ten times apart and the same resource budget, the second time after other checks
left their terms in z3's context (which used to change how z3 searched): the verdicts and the
exported counterexample files must be identical, byte for byte.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from click.testing import CliRunner

from policykit.cli import main

#: the combos whose verdicts or counterexamples flipped with the machine's load
FLIPPED = (
    "sglang/sglang/checkpoint:256",
    "sglang/swa-reserve/truncation:192",
    "sglang/swa-reserve/checkpoint:256",
)
#: the two properties with counterexamples, to the round the no-oom one is found in
SMALL = ("--rounds", "3", "--requests", "3")


def _check(combo: str, timeout_s: float, folder: Path) -> tuple[list[dict], dict[str, bytes]]:
    # --no-cache: the second run must check anew, not take the first one's stored verdicts
    args = ["check", "--combo", combo, *SMALL, "--jobs", "1", "--json", "--no-cache"]
    args += ["--timeout", str(timeout_s), "--export-counterexample", str(folder)]
    out = CliRunner().invoke(main, args)
    assert out.exit_code in (0, 1, 3), out.output
    verdicts = json.loads(out.stdout)["verdicts"]
    rows = [{k: v for k, v in r.items() if k != "seconds"} for r in verdicts]
    files = {p.name: p.read_bytes() for p in sorted(folder.glob("*.json"))}
    return rows, files


@pytest.mark.slow
@pytest.mark.parametrize("combo", FLIPPED)
def test_wall_clock_allowance_does_not_change_verdicts_or_counterexamples(combo, tmp_path):
    first = _check(combo, 600.0, tmp_path / "x1")
    # other checks in between: their terms now sit in z3's context before the second run's
    CliRunner().invoke(main, ["check", "--combo", "reserve-tail/sglang/page", *SMALL, "--json"])
    second = _check(combo, 60.0, tmp_path / "x0.1")
    assert first[0] == second[0]
    assert first[1] == second[1]
    assert first[1], "these combos are violated: their counterexamples must be exported"


def test_the_budget_and_the_safety_net_are_in_the_json(tmp_path):
    args = ["check", "--combo", "reserve-tail/sglang/page", "--rounds", "1", "--requests", "1"]
    out = CliRunner().invoke(main, [*args, "--rlimit", "5000000", "--timeout", "900", "--json"])
    config = json.loads(out.stdout)["config"]
    assert (config["rlimit"], config["timeout_s"]) == (5_000_000, 900.0)
