"""``bounded-overtaking`` (issue 33): shortest-first with the never-fits skip is refuted with a
counterexample ``simulate`` fails on; arrival-order queues are proved for any number of rounds."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from click.testing import CliRunner

from policykit.cli import main
from policykit.config import EngineConfig
from policykit.fairness import OVERTAKING
from policykit.plugin_manager import PluginSource, make_plugin_manager
from policykit.registry import PolicyRegistry
from policykit.spec.checkable import check_or_refuse
from policykit.spec.checker import CheckOptions
from tests.spec import custom_policies

CONFIG = EngineConfig(page_size=64, chunked_prefill_size=4096)
UPSTREAM = "admission=sglang,chunking=sglang,alignment=none"


@pytest.fixture(scope="module")
def pm():
    pm = make_plugin_manager(entry_points=False)
    pm.register_source(custom_policies, PluginSource("acme-policies", "acme-policies", "1.0"))
    return pm


def _verdict(pm, queue: str, **options):
    combo = PolicyRegistry.from_plugins(pm).resolve(f"{UPSTREAM},queue={queue}")
    (v,) = check_or_refuse(combo, CONFIG, CheckOptions(properties=(OVERTAKING,), **options))
    return v


@pytest.mark.parametrize("queue", ["fcfs-skip", "fcfs", "same-rank"])
def test_a_queue_in_arrival_order_is_never_overtaken(pm, queue) -> None:
    """``same-rank`` sorts, but its priority cannot tell two requests apart: z3 finds that."""
    v = _verdict(pm, queue)
    assert (v.verdict, v.bound, v.bounds) == ("proved", "unbounded", None)
    assert "K=1" in v.note and "no request is ever overtaken" in v.note


def test_shortest_first_is_refuted_and_simulate_fails_on_the_counterexample(
    pm, tmp_path: Path
) -> None:
    v = _verdict(pm, "shortest-first")
    assert (v.verdict, v.bound) == ("violated", "round 2")
    assert v.bounds["requests"] == 4 and v.bounds["overtaking"] == 1
    cx = v.counterexample
    assert cx.failure is not None and cx.failure.kind == "overtaken", v.note
    assert cx.scenario["overtaking_bound"] == 1
    path = tmp_path / "cx.json"
    path.write_text(json.dumps(cx.scenario))
    runner = CliRunner()
    out = runner.invoke(main, ["simulate", str(path), "--json"], obj={"pm": pm})
    assert out.exit_code == 5, out.output
    data = json.loads(out.stdout)
    (passed,) = data["overtaken"]
    assert (passed["id"], passed["round"]) == (cx.failure.request, cx.failure.round)
    assert len(passed["by"]) == 2 and data["overtaking_bound"] == 1
    text = runner.invoke(main, ["simulate", str(path)], obj={"pm": pm})
    assert text.exit_code == 5 and "Overtaken (exit 5)" in text.output
    # a bound of 2 lets the same run pass: --overtaking overrides the scenario's
    looser = runner.invoke(main, ["simulate", str(path), "--overtaking", "2"], obj={"pm": pm})
    assert looser.exit_code == 0, looser.output


def test_an_order_that_can_invert_is_never_proved_by_a_search_too_short_to_refute_it(pm) -> None:
    v = _verdict(pm, "shortest-first", rounds=1)
    assert v.verdict == "unknown"
    assert "can put a later arrival first" in v.note and v.shortfall


@pytest.mark.slow
def test_lpm_is_refuted(pm) -> None:
    """``lpm`` serves the longest cached prefix first: two later arrivals with longer prefixes
    pass a waiting request (about 5 s)."""
    v = _verdict(pm, "lpm")
    assert v.verdict == "violated" and v.counterexample.failure.kind == "overtaken"
