"""The vLLM scheduler class under a combo: vLLM 0.33.0's real v1 ``Scheduler`` on a CPU, stepped by
the conformance driver (policykit.conformance.vllm) with the plugin's class swapped in.

On vLLM's own combo the plugin is the identity (tokens per request and their order, preemptions,
completions, releases and blocks per step); under another built-in combo it decides as
``policykit simulate`` (the node that preempts) does; a policy that raises or answers nonsense
costs that decision only, logged once. Skips cleanly without the ``vllm`` extra.
"""

from __future__ import annotations

import dataclasses
import logging
import random

import pytest

from policykit.plugins.vllm import VllmAdmission, VllmChunking
from policykit.plugins.vllm_preemption import VllmPreemption
from policykit.policy import QueuePolicy
from policykit.scenario import parse_scenario

FAITHFUL = "vllm/vllm/none/default/fcfs/vllm"
PER_COMBO = 200


@pytest.fixture(scope="module")
def vllm_side(vllm_oracle):
    """The conformance comparison and the plugin's classes (skips without the extra)."""
    from policykit.conformance.vllm import compare, driver
    from policykit.integrations.vllm import scheduler

    return compare, driver, scheduler


@pytest.fixture(autouse=True)
def _no_startup_proof(monkeypatch):
    """The start-up check is tested on its own; every scheduler here would otherwise run it."""
    monkeypatch.setenv("POLICYKIT_STARTUP_CHECK", "0")
    monkeypatch.delenv("POLICYKIT_CONFIG", raising=False)


def step_rows(steps) -> list[tuple]:
    """What is compared each step (policykit's ``Step`` and the driver's ``StepRecord`` alike):
    tokens per request in scheduling order, preemptions, completions, releases, blocks in use
    and free."""
    return [
        (
            s.round,
            list(s.scheduled.items()),
            s.preempted,
            s.completed,
            s.released,
            s.blocks_used,
            s.blocks_free,
        )
        for s in steps
    ]


def trace_rows(trace) -> list[tuple]:
    """A driver trace's rows, then the requests that never finished."""
    return [*step_rows(trace.steps), tuple(trace.unfinished)]


def test_faithful_combo_is_the_identity_with_vllms_scheduler(vllm_side, monkeypatch):
    compare, driver, scheduler = vllm_side
    rng = random.Random(23)
    runs = [compare.random_scenario(rng, i) for i in range(PER_COMBO)]
    preempting = 0
    # no combo set: the plugin derives vLLM's own from the knobs (threshold, reservation,
    # --scheduling-policy)
    monkeypatch.delenv("POLICYKIT_COMBO", raising=False)
    by_priority = 0
    for index, (sc, knobs) in enumerate(runs):
        own = driver.drive(sc, knobs, max_rounds=compare.MAX_ROUNDS)
        cls = scheduler.PolicyAsyncScheduler if index % 4 else scheduler.PolicyScheduler
        plugged = driver.drive(sc, knobs, max_rounds=compare.MAX_ROUNDS, scheduler_cls=cls)
        assert trace_rows(plugged) == trace_rows(own), (sc.name, knobs, cls.__name__)
        preempting += bool(own.preemptions())
        by_priority += knobs.scheduling_policy == "priority" and bool(own.preemptions())
    assert preempting >= 15  # the comparison reaches vLLM's preemptions
    assert by_priority >= 3  # and those of its priority path


def _threshold(rng: random.Random) -> str:
    return f"vllm-threshold:{rng.randint(1, 64)}"


#: each built-in vLLM combo other than vLLM's own (a threshold drawn per scenario)
COMBOS = {
    "no-reserve": lambda rng: "vllm-no-reserve/vllm/none/default/fcfs/vllm",
    "threshold": lambda rng: f"vllm/{_threshold(rng)}/none/default/fcfs/vllm",
    "lpm": lambda rng: "vllm/vllm/none/default/lpm/vllm",
    "page-aligned": lambda rng: "vllm/vllm/page/default/fcfs/vllm",
    "all-of-them": lambda rng: f"vllm-no-reserve/{_threshold(rng)}/page/default/lpm/vllm",
}


@pytest.mark.slow
@pytest.mark.parametrize("name", sorted(COMBOS))
def test_under_the_plugin_vllm_decides_as_policykit_simulate(vllm_side, monkeypatch, name):
    compare, _, scheduler = vllm_side
    knobs = compare.SchedulerKnobs()  # vLLM's own settings: the combo alone changes decisions
    rng = random.Random(f"vllm-plugin-{name}")
    differing = 0
    for index in range(PER_COMBO):
        sc, _ = compare.random_scenario(rng, index)
        combo = COMBOS[name](rng)
        monkeypatch.setenv("POLICYKIT_COMBO", combo)
        verdict = compare.conform(
            sc, knobs, combo=combo, scheduler_cls=scheduler.PolicyAsyncScheduler
        )
        assert verdict.differences == [], (sc.name, combo)
        ours = compare.model_steps(sc, knobs, compare.MAX_ROUNDS, combo)
        vllms = compare.model_steps(sc, knobs, compare.MAX_ROUNDS, FAITHFUL)
        differing += step_rows(ours) != step_rows(vllms)
    # not vacuous: the combo decides otherwise than vLLM on a share of the scenarios
    assert differing >= 10


# -- a policy that fails -----------------------------------------------------------------------
class RaisingAdmission(VllmAdmission):
    name = "raising"

    def admit(self, v):
        raise KeyError("boom")


class NonsenseChunking(VllmChunking):
    name = "nonsense"

    def new_chunk(self, v):
        return "lots"

    def resume_chunk(self, v):
        return v.remaining_tokens + 5


class RaisingQueue(QueuePolicy):
    name = "raising-queue"
    arrival_order = False

    def priority(self, v):
        raise ValueError("no order today")


class FirstVictim(VllmPreemption):
    """Preempts the request admitted first: before the requester, which vLLM cannot take."""

    name = "first"

    def victim_rank(self, v):
        return -v.position


#: a tight pool, no full-sequence reservation and a long-prefill threshold: eight requests run
#: at once and outgrow the pool, so one run has many admissions, chunks and preemptions
BUSY = {
    "name": "busy",
    "page_size": 4,
    "chunked_prefill_size": 64,
    "pool": {"free_tokens": 128, "evictable_tokens": 0},
    "kv_release_rounds": 2,
    "requests": [{"id": f"r{i}", "prompt_tokens": 30 + 7 * i} for i in range(8)],
}


def busy_knobs(compare):
    return compare.SchedulerKnobs(scheduler_reserve_full_isl=False, long_prefill_token_threshold=8)


def _plugged(monkeypatch, scheduler, combo=FAITHFUL, **policies):
    """The plugin's class, running ``combo`` with ``policies`` swapped in."""
    from policykit.integrations.vllm import startup

    resolve = startup.resolve

    def swapped(text, *args):
        combo, registry = resolve(text, *args)
        return dataclasses.replace(combo, **policies), registry

    monkeypatch.setattr(startup, "resolve", swapped)
    monkeypatch.setenv("POLICYKIT_COMBO", combo)
    return scheduler.PolicyAsyncScheduler


@pytest.mark.parametrize(
    "policies",
    [
        {"admission": RaisingAdmission()},
        {"chunking": NonsenseChunking()},
        {"queue": RaisingQueue()},
        {"preemption": FirstVictim()},
    ],
    ids=["raising-admission", "ill-typed-chunk", "raising-queue", "unreachable-victim"],
)
def test_a_failing_policy_falls_back_to_vllm_with_one_log_line(
    vllm_side, monkeypatch, caplog, policies
):
    compare, driver, scheduler = vllm_side
    sc = parse_scenario(BUSY)
    knobs = busy_knobs(compare)
    own = driver.drive(sc, knobs)
    assert own.preemptions() and len(own.steps) > 8  # many decisions, a victim among them
    cls = _plugged(monkeypatch, scheduler, compare.vllm_combo(knobs), **policies)
    with caplog.at_level(logging.ERROR, logger="policykit.vllm"):
        plugged = driver.drive(sc, knobs, scheduler_cls=cls)
    assert trace_rows(plugged) == trace_rows(own)  # vLLM's own decisions, every step
    lines = [r.getMessage() for r in caplog.records if r.name == "policykit.vllm"]
    (kind,) = policies
    questions = {"admission": 1, "chunking": 2, "queue": 1, "preemption": 1}[kind]
    assert len(lines) == questions, lines  # one per question and reason, not per step
    assert all("vLLM decides instead" in line and policies[kind].name in line for line in lines)


@pytest.mark.slow
def test_a_third_party_victim_after_the_requester_is_taken(vllm_side, monkeypatch, caplog):
    """A victim vLLM's path can take is taken: where the plugin logged no fallback, the run
    decides as ``policykit simulate`` does with the same policy object, and on some of those
    runs otherwise than vLLM's own victim (``running[-1]``)."""
    compare, driver, scheduler = vllm_side
    from policykit.preempting_scenario import prepare, run
    from policykit.registry import builtin_registry

    class LongestPrompt(VllmPreemption):
        name = "longest-prompt"

        def victim_rank(self, v):
            return v.prompt_tokens * 1000 + v.position

    victim = LongestPrompt()
    cls = _plugged(monkeypatch, scheduler, preemption=victim)
    rng = random.Random(5)
    taken = changed = 0
    for index in range(250):
        sc, _ = compare.random_scenario(rng, index)
        # several requests run at once (no reservation, a threshold): victims besides the last
        longest = max(r.prompt_tokens for r in sc.requests)
        knobs = compare.SchedulerKnobs(
            scheduler_reserve_full_isl=False, long_prefill_token_threshold=min(8, longest)
        )
        text = compare.vllm_combo(knobs)
        monkeypatch.setenv("POLICYKIT_COMBO", text)
        caplog.clear()
        with caplog.at_level(logging.ERROR, logger="policykit.vllm"):
            plugged = driver.drive(sc, knobs, scheduler_cls=cls)
        if not plugged.preemptions() or caplog.records:
            continue
        combo = dataclasses.replace(builtin_registry().resolve(text), preemption=victim)
        sched, _ = prepare(sc, combo, max_running=driver.max_num_seqs(sc, knobs))
        ours = run(sched, len(sc.requests), compare.MAX_ROUNDS)
        assert step_rows(ours) == step_rows(plugged.steps), sc.name
        taken += 1
        changed += trace_rows(plugged) != trace_rows(driver.drive(sc, knobs))
    assert taken >= 20 and changed >= 4, (taken, changed)


def _overlapped(driver, scheduler, sc, knobs) -> list[tuple]:
    """``sc``'s prompts through ``scheduler`` as vLLM's engine core runs it with async
    scheduling: step N+1 is scheduled before step N's output comes back (a batch queue two
    deep); finished prefills give their KV back with that output. Each step's tokens per request
    and preemptions."""
    from vllm.v1.request import RequestStatus

    hasher = driver._block_hasher(sc.config.page_size)
    pending = sorted(enumerate(sc.requests), key=lambda p: p[1].arrival_round)
    rows, in_flight, added = [], [], 0
    for step in range(1, 400):
        while pending and pending[0][1].arrival_round <= step:
            index, spec = pending.pop(0)
            tokens = driver._prompt(index, spec.prompt_tokens)
            added += 1  # arrival times in the order requests arrive, as in an engine
            scheduler.add_request(driver._make_request(spec.id, tokens, hasher, float(added)))
        out = scheduler.schedule()
        rows.append((list(out.num_scheduled_tokens.items()), sorted(out.preempted_req_ids)))
        in_flight.append((out, driver._prefills_done(scheduler, list(out.num_scheduled_tokens))))
        if len(in_flight) == 2 or not out.num_scheduled_tokens:
            done_out, done = in_flight.pop(0)
            ids = list(done_out.num_scheduled_tokens)
            # a prefill the overlapped step preempted did not finish: no token, no transfer
            done = [r for r in done if scheduler.requests[r].status == RequestStatus.RUNNING]
            scheduler.update_from_output(
                done_out, driver._runner_output(scheduler, ids, done, done)
            )
        if not pending and not scheduler.get_num_unfinished_requests() and not in_flight:
            break
    return rows


def test_the_identity_holds_with_steps_overlapped_as_async_scheduling_runs_them(
    vllm_side, monkeypatch
):
    compare, driver, scheduler = vllm_side
    from vllm.v1.core.sched.async_scheduler import AsyncScheduler

    from policykit.conformance.vllm.engine import build_scheduler

    rng = random.Random(7)
    compared = preempting = 0
    monkeypatch.delenv("POLICYKIT_COMBO", raising=False)  # vLLM's own, derived from the knobs
    for index in range(120):
        sc, knobs = compare.random_scenario(rng, index)
        if any(r.device_prefix_tokens for r in sc.requests):
            continue  # no prefix owners here: only the prompts
        traces = []
        for cls in (AsyncScheduler, scheduler.PolicyAsyncScheduler):
            sched = build_scheduler(
                block_size=sc.config.page_size,
                num_blocks=driver.pool_blocks(sc) + 1,
                budget=sc.config.chunked_prefill_size,
                max_model_len=max(r.prompt_tokens for r in sc.requests) + 1,
                max_num_seqs=driver.max_num_seqs(sc, knobs),
                knobs=knobs,
                scheduler_cls=cls,
            )
            traces.append(_overlapped(driver, sched, sc, knobs))
        assert traces[1] == traces[0], (sc.name, knobs)
        compared += 1
        preempting += any(preempted for _, preempted in traces[0])
    assert compared >= 30 and preempting >= 3, (compared, preempting)
