"""The policykit SGLang plugin on SGLang 0.5.23's real ``PrefillAdder`` (CPU; GPU modules stubbed).

Driven by the conformance driver (:mod:`policykit.conformance.sglang.driver`). Skipped when
SGLang is not installed (``pip install 'policykit[sglang]'``).
"""

from __future__ import annotations

import dataclasses
import importlib.util
import logging
import random
from contextlib import nullcontext
from pathlib import Path

import pytest

if importlib.util.find_spec("sglang") is None:
    pytest.skip("the policykit[sglang] extra is not installed", allow_module_level=True)

from policykit import planner
from policykit.conformance.sglang.compare import (
    UPSTREAM_COMBO,
    _round_view,
    diff,
    random_scenario,
    run_policykit,
)
from policykit.conformance.sglang.run import drive
from policykit.conformance.sglang.storage import NotExpressible
from policykit.integrations.sglang import hooks
from policykit.integrations.sglang.plugin import applied
from policykit.plugins.queue import FcfsQueue
from policykit.policy import (
    AdmissionPolicy,
    AdmitView,
    AlignView,
    ChunkingPolicy,
    ChunkView,
    QueuePolicy,
    TailView,
)
from policykit.registry import PolicyRegistry, registry_from
from policykit.scenario import build_node, load_scenario
from policykit.scheduler import Scheduler

ROOT = Path(__file__).resolve().parents[2]
SEED = load_scenario(ROOT / "policykit" / "scenarios" / "seed-incident-1keim.json")
FORK = "admission=sglang,chunking=sglang,alignment=checkpoint:256"
RESERVE_TAIL = "admission=reserve-tail,chunking=sglang,alignment=checkpoint:256"
#: random scenarios for the identity test and per combo for the simulate comparison (the
#: acceptance asks for at least 200 each)
COUNT = 200
#: SGLang's waiting queue as the driver runs it (fcfs, the head blocks): the engine never skips
#: a refused request, so a combo compared with ``policykit simulate`` names a queue that does not
FCFS = ",queue=fcfs"


pytestmark = pytest.mark.usefixtures("upstream")


@pytest.fixture(scope="module")
def registry() -> PolicyRegistry:
    return registry_from()


def _upstream(scenario, combo=None):
    with applied(combo) if combo is not None else nullcontext():
        return drive(scenario, max_rounds=400)


def _outcome(run) -> tuple:
    return ([_round_view(r.plan) for r in run.rounds], run.oom, sorted(run.completed))


def _scenarios(seed: object, count: int) -> list:
    """``count`` random scenarios (a quarter with hybrid SWA), with their plain upstream runs;
    those SGLang's storage cannot be in (a host run's last window more than the whole
    sliding-window pool) left out."""
    rng = random.Random(seed)
    out = []
    for i in range(count):
        scenario = random_scenario(rng, i)
        try:
            out.append((scenario, _upstream(scenario)))
        except NotExpressible:
            continue
    return out


def _hooked_runs(scenarios: list, combo) -> list:
    """Each scenario driven through the real adder with the hooks applied once for all."""
    with applied(combo):
        return [drive(scenario, max_rounds=400) for scenario, _ in scenarios]


@pytest.mark.slow
def test_faithful_combo_leaves_upstream_decisions_unchanged(registry):
    scenarios = _scenarios(1515, COUNT)
    hooked = _hooked_runs(scenarios, registry.resolve(UPSTREAM_COMBO))
    differing = [
        s.name
        for (s, plain), run in zip(scenarios, hooked, strict=True)
        if _outcome(plain) != _outcome(run)
    ]
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


def _compare_with_simulate(
    chosen, combo: str, seed: object, count: int, schedule_policy: str = "fcfs"
) -> list:
    """The differences between the real adder under the plugin and ``policykit simulate``,
    one ``(scenario, first differing line)`` per differing scenario. ``schedule_policy`` is
    SGLang's own ``--schedule-policy``, which sorts the queue before the plugin does."""
    rng, compared, differing = random.Random(seed), 0, []
    with applied(chosen):
        while compared < count:
            scenario = random_scenario(rng, compared, hybrid_swa=False)
            if chosen.alignment.name == "checkpoint" and 256 % scenario.config.page_size:
                continue
            theirs = drive(scenario, max_rounds=400, schedule_policy=schedule_policy)
            if not hasattr(theirs, "rounds"):
                continue
            compared += 1
            lines = diff(run_policykit(scenario, combo, max_rounds=400), theirs)
            if lines:
                differing.append((scenario.name, lines[0]))
    return differing


@pytest.mark.slow
@pytest.mark.parametrize(
    "combo",
    [
        "admission=reserve-tail,chunking=sglang,alignment=none" + FCFS,
        "admission=reserve-tail,chunking=defer,alignment=page" + FCFS,
        "admission=sglang,chunking=sglang,alignment=checkpoint:256" + FCFS,
    ],
)
def test_real_adder_under_the_plugin_decides_as_policykit_simulate(registry, combo):
    differing = _compare_with_simulate(registry.resolve(combo), combo, combo, COUNT)
    assert not differing, differing[:5]


LPM = "admission=reserve-tail,chunking=sglang,alignment=none,queue=lpm"


@pytest.mark.slow
@pytest.mark.parametrize(
    "combo, engine, count",
    [
        (LPM, "fcfs", COUNT),  # SGLang keeps arrival order; the plugin sorts longest prefix first
        (LPM, "lpm", 60),  # SGLang's own lpm replaced by the plugin's
    ],
)
def test_the_queue_policy_orders_sglangs_waiting_queue(registry, combo, engine, count):
    """``SchedulePolicy.calc_priority`` under the plugin leaves the queue in the order
    ``policykit simulate`` looks at it, whatever SGLang's ``--schedule-policy`` sorted first."""
    differing = _compare_with_simulate(registry.resolve(combo), combo, combo, count, engine)
    assert not differing, differing[:5]


ARRIVAL = "admission=reserve-tail,chunking=sglang,alignment=none" + FCFS


def test_an_engine_lpm_under_an_arrival_order_plugin_keeps_its_own_recency(registry):
    """Known difference (docs/conformance.md): SGLang's ``--schedule-policy lpm`` matches every
    waiting request while it sorts, before the plugin puts them back in arrival order, and
    skips the refresh of waiting prefixes; ``policykit simulate`` of an arrival-order queue
    refreshes them instead (the engine's default ``fcfs``). Recency, and so what an eviction
    takes, can differ: 1 of these 60 scenarios, where r5's 256-token prefix survives in the
    simulation and not in the engine."""
    differing = _compare_with_simulate(registry.resolve(ARRIVAL), ARRIVAL, ARRIVAL, 60, "lpm")
    assert [(name, line.split(":")[0]) for name, line in differing] == [
        ("random-34", "round 2 batch")
    ]
    assert "('r5', 256, 367, 'whole')" in differing[0][1].split("!=")[0]


@pytest.mark.slow
def test_the_queue_hook_changes_the_order():
    """The test above is not vacuous: on the same scenarios, longest-prefix-first decides
    differently from arrival order in some of them."""
    rng = random.Random(LPM)
    scenarios = [(random_scenario(rng, i, hybrid_swa=False), None) for i in range(60)]
    lpm = registry_from().resolve(LPM)
    by_prefix = _hooked_runs(scenarios, lpm)
    by_arrival = _hooked_runs(scenarios, dataclasses.replace(lpm, queue=FcfsQueue()))
    changed = sum(_outcome(a) != _outcome(b) for a, b in zip(by_prefix, by_arrival, strict=True))
    assert changed >= 3, changed


class ShortestFirst(QueuePolicy):
    """Fewest tokens to compute first (a third-party order the built-ins do not have)."""

    name = "shortest-first"
    source = "plugin test-dist 0.1"

    def priority(self, v):
        return v.prompt_tokens - v.prefix_tokens - v.host_prefix_tokens


@pytest.mark.slow
def test_a_third_party_order_decides_in_the_engine_as_in_simulate(registry):
    combo = dataclasses.replace(registry.resolve(LPM), queue=ShortestFirst())
    rng, compared, differing = random.Random("shortest"), 0, []
    with applied(combo):
        while compared < 100:
            scenario = random_scenario(rng, compared, hybrid_swa=False)
            theirs = drive(scenario, max_rounds=400)
            if not hasattr(theirs, "rounds"):
                continue
            compared += 1
            ours = Scheduler(build_node(scenario), combo, fail_stuck=False).run(400)
            if lines := diff(ours, theirs):
                differing.append((scenario.name, lines[0]))
    assert not differing, differing[:5]


class RaisingQueue(QueuePolicy):
    name = "raising-queue"
    source = "plugin test-dist 0.1"

    def priority(self, v):
        raise ValueError("no order today")


def test_a_raising_priority_keeps_upstreams_order_and_the_rounds_run(registry, caplog):
    combo = dataclasses.replace(registry.resolve(UPSTREAM_COMBO), queue=RaisingQueue())
    scenario = load_scenario(ROOT / "policykit" / "scenarios" / "seed-incident-1keim.json")
    with caplog.at_level(logging.ERROR, logger="policykit.sglang"):
        run = _upstream(scenario, combo)
    assert _outcome(run) == _outcome(_upstream(scenario))
    lines = [r.getMessage() for r in caplog.records]
    assert lines and all("'raising-queue'" in m and "priority()" in m for m in lines)


NO_EVICT = "admission=no-evict,chunking=sglang,alignment=page" + FCFS


def _admit_without_retry(self, req, ledger, locked, entries, loads):
    """``Planner._admit`` without its second try: a request that fitted until its cached
    prefix was locked is refused, as SGLang's adder refuses it."""
    verdict = self._admit_with(req, ledger, locked, entries, loads, reuse=True)
    return planner.Budget.NO_TOKEN if verdict is planner._LOCK_REFUSED else verdict


@pytest.mark.slow
def test_no_evict_differs_from_simulate_only_by_the_lock_refused_retry(registry, monkeypatch):
    """docs/deploy-sglang.md: policykit's planner retries a request whose own cached prefix,
    once locked, made it not fit, computing its prompt afresh; SGLang's adder has no such path
    (the prefix is matched and locked before ``_select_prefill_admission`` is called). Only
    ``no-evict`` reaches it among the built-ins (it charges the whole prompt, prefix or not).
    With the retry taken out of the planner the two decide alike; with it, they differ."""
    chosen = registry.resolve(NO_EVICT)
    assert _compare_with_simulate(chosen, NO_EVICT, "no-evict", 60)
    monkeypatch.setattr(planner.Planner, "_admit", _admit_without_retry)
    differing = _compare_with_simulate(chosen, NO_EVICT, "no-evict", 60)
    assert not differing, differing[:5]


def test_policies_receive_the_public_view_classes(registry):
    """What a policy gets inside the engine is what it gets in ``policykit simulate``: the
    public view classes, with int fields."""
    combo = registry.resolve(RESERVE_TAIL)
    seen: list = []

    class Admitting(type(combo.admission)):
        def admit(self, v):
            seen.append(v)
            return super().admit(v)

        def tail_reserve(self, v):
            seen.append(v)
            return super().tail_reserve(v)

    class Chunking(type(combo.chunking)):
        def new_chunk(self, v):
            seen.append(v)
            return super().new_chunk(v)

        def resume_chunk(self, v):
            seen.append(v)
            return super().resume_chunk(v)

    class Aligning(type(combo.alignment)):
        def align_end(self, v):
            seen.append(v)
            return super().align_end(v)

    combo = dataclasses.replace(
        combo, admission=Admitting(), chunking=Chunking(), alignment=Aligning(combo.alignment.arg)
    )
    _upstream(SEED, combo)
    assert {type(v) for v in seen} == {AdmitView, ChunkView, AlignView, TailView}
    for v in seen:
        fields = dataclasses.asdict(v)
        assert v == type(v)(**fields)
        assert all(type(x) is int for k, x in fields.items() if k != "hybrid_swa")


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
    combo = dataclasses.replace(registry.resolve(UPSTREAM_COMBO), admission=Raising())
    with caplog.at_level(logging.ERROR, logger="policykit.sglang"):
        run = _upstream(SEED, combo)
    assert _outcome(run) == _outcome(_upstream(SEED))  # every decision fell back, rounds ran
    lines = [r.getMessage() for r in caplog.records]
    assert lines and all("'raising'" in m and "test-dist" in m for m in lines)
    assert any("request 'v9uj'" in m and "KeyError" in m for m in lines)


def test_a_nonsense_answer_is_logged_and_upstream_decides(registry, caplog):
    combo = dataclasses.replace(registry.resolve(UPSTREAM_COMBO), chunking=Nonsense())
    with caplog.at_level(logging.ERROR, logger="policykit.sglang"):
        run = _upstream(SEED, combo)
    assert _outcome(run) == _outcome(_upstream(SEED))
    assert any("'lots'" in r.getMessage() and "new_chunk" in r.getMessage() for r in caplog.records)
    assert any("-3" in r.getMessage() and "resume_chunk" in r.getMessage() for r in caplog.records)


def test_hooks_pass_through_when_no_combo_is_active():
    assert hooks.active() is None
    assert _outcome(_upstream(SEED)) == _outcome(_upstream(SEED))
