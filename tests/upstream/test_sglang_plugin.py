"""The policykit SGLang plugin on SGLang 0.5.23's real ``PrefillAdder`` (CPU; GPU modules stubbed).

Driven by the conformance driver (:mod:`policykit.upstream.sglang`). Skipped when SGLang is not
installed (``pip install 'policykit[sglang]'``).
"""

from __future__ import annotations

import dataclasses
import importlib.util
import logging
import os
import random
from contextlib import nullcontext
from pathlib import Path

import pytest

if importlib.util.find_spec("sglang") is None:
    pytest.skip("the policykit[sglang] extra is not installed", allow_module_level=True)

from policykit.integrations.sglang import hooks
from policykit.integrations.sglang.plugin import applied
from policykit.policy import AdmissionPolicy, ChunkingPolicy
from policykit.registry import PolicyRegistry, registry_from
from policykit.scenario import load_scenario
from policykit.upstream.conformance import (
    UPSTREAM_COMBO,
    _round_view,
    diff,
    random_scenario,
    run_policykit,
)
from policykit.upstream.sglang import drive

ROOT = Path(__file__).resolve().parents[2]
SEED = load_scenario(ROOT / "policykit" / "scenarios" / "seed-incident-1keim.json")
FORK = "admission=sglang,chunking=sglang,alignment=checkpoint:256"
RESERVE_TAIL = "admission=reserve-tail,chunking=sglang,alignment=checkpoint:256"
#: random scenarios for the identity test (the acceptance asks for at least 200)
COUNT = 200
#: random scenarios per combo for the simulate comparison; 200 each was run for the report, the
#: default keeps the suite's time in bounds on two cores
PER_COMBO = int(os.environ.get("POLICYKIT_SGLANG_SCENARIOS", "100"))


pytestmark = pytest.mark.usefixtures("upstream")


@pytest.fixture(scope="module")
def registry() -> PolicyRegistry:
    return registry_from()


def _upstream(scenario, combo=None):
    with applied(combo) if combo is not None else nullcontext():
        return drive(scenario, max_rounds=400)


def _outcome(run) -> tuple:
    return ([_round_view(r.plan) for r in run.rounds], run.oom, sorted(run.completed))


def test_faithful_combo_leaves_upstream_decisions_unchanged(registry):
    combo = registry.resolve(UPSTREAM_COMBO)
    rng = random.Random(1515)
    compared, differing = 0, []
    while compared < COUNT:
        scenario = random_scenario(rng, compared)
        plain = _upstream(scenario)
        if not hasattr(plain, "rounds"):
            continue  # not expressible to upstream at all
        compared += 1
        if _outcome(plain) != _outcome(_upstream(scenario, combo)):
            differing.append(scenario.name)
    assert not differing, differing


def test_hooks_change_decisions_when_the_combo_differs(registry):
    """The identity test above is not vacuous: the same hooks with the fork combo decide
    seed 000 differently from upstream."""
    plain = _upstream(SEED)
    forked = _upstream(SEED, registry.resolve(FORK))
    assert _outcome(plain) != _outcome(forked)


def test_seed_incident_fork_runs_out_of_memory_reserve_tail_does_not(registry):
    forked = _upstream(SEED, registry.resolve(FORK))
    assert forked.oom is not None
    fixed = _upstream(SEED, registry.resolve(RESERVE_TAIL))
    assert fixed.oom is None
    assert "1keim" in fixed.completed


@pytest.mark.parametrize(
    "combo",
    [
        "admission=reserve-tail,chunking=sglang,alignment=none",
        "admission=reserve-tail,chunking=defer,alignment=page",
        "admission=sglang,chunking=sglang,alignment=checkpoint:256",
    ],
)
def test_real_adder_under_the_plugin_decides_as_policykit_simulate(registry, combo):
    chosen = registry.resolve(combo)
    rng = random.Random(combo)
    compared, differing = 0, []
    while compared < PER_COMBO:
        scenario = random_scenario(rng, compared, hybrid_swa=False)
        if chosen.alignment.name == "checkpoint" and 256 % scenario.page_size:
            continue
        theirs = _upstream(scenario, chosen)
        if not hasattr(theirs, "rounds"):
            continue
        compared += 1
        lines = diff(run_policykit(scenario, combo, max_rounds=400), theirs)
        if lines:
            differing.append((scenario.name, lines[0]))
    assert not differing, differing[:5]


class Raising(AdmissionPolicy):
    name = "raising"
    source = "plugin test-dist 0.1"

    def admit(self, v):
        raise KeyError("boom")

    def tail_reserve(self, v):
        raise KeyError("boom")


class Nonsense(ChunkingPolicy):
    name = "nonsense"
    source = "plugin test-dist 0.1"

    def new_chunk(self, v):
        return "lots"

    def resume_chunk(self, v):
        return -3


def test_a_raising_policy_is_logged_and_upstream_decides(registry, caplog):
    combo = registry.resolve(UPSTREAM_COMBO)
    combo = dataclasses.replace(combo, admission=Raising())
    with caplog.at_level(logging.ERROR, logger="policykit.sglang"):
        run = _upstream(SEED, combo)
    assert _outcome(run) == _outcome(_upstream(SEED))  # every decision fell back, rounds ran
    lines = [r.getMessage() for r in caplog.records]
    assert lines and all("'raising'" in m and "test-dist" in m for m in lines)
    assert any("request 'v9uj'" in m and "KeyError" in m for m in lines)


def test_a_nonsense_answer_is_logged_and_upstream_decides(registry, caplog):
    combo = registry.resolve(UPSTREAM_COMBO)
    combo = dataclasses.replace(combo, chunking=Nonsense())
    with caplog.at_level(logging.ERROR, logger="policykit.sglang"):
        run = _upstream(SEED, combo)
    assert _outcome(run) == _outcome(_upstream(SEED))
    assert any("'lots'" in r.getMessage() and "new_chunk" in r.getMessage() for r in caplog.records)
    assert any("-3" in r.getMessage() and "resume_chunk" in r.getMessage() for r in caplog.records)


def test_hooks_pass_through_when_no_combo_is_active():
    assert hooks.active() is None
    assert _outcome(_upstream(SEED)) == _outcome(_upstream(SEED))
