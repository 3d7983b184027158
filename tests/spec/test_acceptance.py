"""The issue's acceptance checks: seed 000, seed 001, and the combos that must be proved."""

from __future__ import annotations

import json

import pytest
from click.testing import CliRunner

from policykit.cli import main
from policykit.config import EngineConfig
from policykit.scenario import build_node, parse_scenario
from policykit.scheduler import Scheduler
from policykit.spec.checker import CheckOptions, check_combo
from policykit.spec.solver import QUERY_RLIMIT

PAGE64 = EngineConfig(page_size=64, chunked_prefill_size=4096)


#: z3 resource units per solver query: the CLI's default (a budget, not seconds, so a slow
#: machine reads the same proofs)
RLIMIT = QUERY_RLIMIT


def _verdicts(registry, combo: str, config: EngineConfig = PAGE64, **kw) -> dict:
    options = CheckOptions(**{"rounds": 4, "requests": 3, "rlimit": RLIMIT, **kw})
    return {v.property: v for v in check_combo(registry.resolve(combo), config, options)}


def test_seed_000_is_violated_and_the_counterexample_replays_to_an_oom(registry) -> None:
    combo = "admission=sglang,chunking=sglang,alignment=checkpoint:256"
    v = _verdicts(registry, combo)
    oom = v["no-oom"]
    assert oom.verdict == "violated"
    cx = oom.counterexample
    first = cx.rounds[0]
    kinds = [row.kind for row in first.rows]
    # a request is truncated, and a later request still enters the same round
    assert "truncated" in kinds
    assert kinds.index("truncated") < len(kinds) - 1
    assert cx.rounds[-1].oom == "full"
    result = Scheduler(build_node(parse_scenario(cx.scenario)), registry.resolve(combo)).run()
    assert result.oom is not None and result.oom.round == cx.round


def test_the_seed_000_fix_is_proved_unbounded(registry) -> None:
    v = _verdicts(registry, "admission=reserve-tail,chunking=sglang,alignment=checkpoint:256")
    for prop in ("no-oom", "admitted-completes", "ledger", "contract", "progress"):
        assert (v[prop].verdict, v[prop].bound) == ("proved", "unbounded"), prop


def test_defer_trades_the_oom_for_a_wait(registry) -> None:
    """With seed 000's admission, ``defer`` never OOMs (proved for any number of rounds), but
    the truncated request's tail is still taken and it waits: admitted => completes fails."""
    combo = "admission=sglang,chunking=defer,alignment=checkpoint:256"
    v = _verdicts(registry, combo, properties=("no-oom", "admitted-completes"))
    assert (v["no-oom"].verdict, v["no-oom"].bound) == ("proved", "unbounded")
    assert v["admitted-completes"].verdict == "violated"


@pytest.mark.parametrize("alignment", ["page", "none"])
def test_upstream_implicit_protection_is_proved_unbounded(registry, alignment) -> None:
    """A truncation aligned to the page spends the whole compute budget, so nothing else joins
    the round to take the tail: admitted => completes for any number of rounds and requests."""
    combo = f"admission=sglang,chunking=sglang,alignment={alignment}"
    v = _verdicts(registry, combo, properties=("no-oom", "admitted-completes"))
    for prop in ("no-oom", "admitted-completes"):
        assert (v[prop].verdict, v[prop].bound) == ("proved", "unbounded"), prop


SWA = EngineConfig(page_size=64, chunked_prefill_size=4096, sliding_window=512)


def test_seed_001_pre_fix_swa_chunking_is_violated(registry) -> None:
    combo = "admission=reserve-tail,chunking=sglang-pre-swa-fix,alignment=page"
    v = _verdicts(registry, combo, SWA, properties=("swa-no-oom",))
    assert v["swa-no-oom"].verdict == "violated"
    scenario = v["swa-no-oom"].counterexample.scenario
    combo = registry.resolve(scenario["combo"])
    result = Scheduler(build_node(parse_scenario(scenario)), combo).run()
    assert result.oom is not None and result.oom.pool == "swa"


@pytest.mark.slow
def test_seed_001_fix_is_proved_safe_from_oom_but_can_strand_a_request(registry) -> None:
    """The seed 001 fix never runs either pool out of memory, but a finding (docs/spec.md):
    ``swa-reserve`` starts a request the sliding-window pool can never finish, and the
    scheduler fails it as stuck after admission, which violates admitted => completes."""
    v = _verdicts(registry, "admission=reserve-tail,chunking=swa-reserve,alignment=page", SWA)
    assert (v["no-oom"].verdict, v["no-oom"].bound) == ("proved", "unbounded")
    # unbounded although the ledger's window-capped estimate over-charges the real ``extend +
    # page``: the induction tracks the real sliding-window allocations (tests/spec/
    # test_swa_induction.py)
    assert (v["swa-no-oom"].verdict, v["swa-no-oom"].bound) == ("proved", "unbounded")
    assert v["admitted-completes"].verdict == "violated"
    failure = v["admitted-completes"].counterexample.failure
    assert failure is not None and (failure.kind, failure.detail) == ("never-completes", "stuck")


def test_cli_exports_a_scenario_that_simulate_replays_to_the_oom(tmp_path) -> None:
    runner = CliRunner()
    combo = "admission=sglang,chunking=sglang,alignment=checkpoint:256"
    # a generous query timeout: a loaded machine must not turn the violation into unknown
    args = ["check", "--combo", combo, "--json", "--timeout", "120"]
    out = runner.invoke(main, [*args, "--export-counterexample", str(tmp_path)])
    assert out.exit_code == 1, out.output
    data = json.loads(out.stdout)
    assert {v["property"]: v["verdict"] for v in data["verdicts"]}["no-oom"] == "violated"
    (exported,) = tmp_path.glob("*.no-oom.json")
    sim = runner.invoke(main, ["simulate", str(exported), "--json"])
    assert sim.exit_code == 1, sim.output
    assert json.loads(sim.stdout)["oom"] is not None


@pytest.mark.parametrize(
    "args",
    [
        ["--combo", "admission=nope"],
        ["--all", "--combo", "admission=sglang"],
        ["--sliding-window", "8"],
        ["--rounds", "0"],
    ],
)
def test_bad_input_exits_2_without_a_traceback(args) -> None:
    out = CliRunner().invoke(main, ["check", *args])
    assert out.exit_code == 2
    assert "Traceback" not in out.output
