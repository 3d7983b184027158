"""``policykit check`` on combos that preempt: the bounded model of vLLM's node
(:mod:`policykit.spec.preempting_bmc`), its verdicts, and its counterexamples replayed.

The model must admit every run of the scheduler (:class:`policykit.preempting.PreemptingScheduler`):
random scenarios are run on the scheduler and the model is asked for that very run, step by
step, under random combos that preempt. Then the verdicts of vLLM's own combos, the
counterexample of the finding replayed by ``policykit simulate`` (exit 3), and the CLI.
"""

from __future__ import annotations

import json
import random

import pytest
import z3
from click.testing import CliRunner

from policykit.cli import main
from policykit.cli.check import _combos
from policykit.config import EngineConfig
from policykit.preempting_scenario import prepare
from policykit.registry import VERDICT_KINDS
from policykit.scenario import parse_scenario
from policykit.spec.checkable import check_or_refuse
from policykit.spec.checker import CheckOptions
from policykit.spec.encoding import Encoder
from policykit.spec.preempting_bmc import unroll
from policykit.spec.preempting_induction import step_breaks_it
from policykit.spec.preempting_replay import counterexample
from policykit.spec.preempting_shrink import shrunk
from policykit.spec.solver import solve, unrolled

CONFIG = EngineConfig(16, 64)
ROUNDS = 3
#: random seeds, five scenarios each
SEEDS = 8


def _random_case(rng: random.Random) -> dict:
    """Two requests in a small pool, often long enough together to preempt."""
    pool = rng.randint(2, 6 if rng.random() < 0.6 else 12)
    # a short first one leaves budget for the second to start beside it
    first = rng.randint(1, 32) if rng.random() < 0.6 else rng.randint(1, pool * 16)
    prompts = [first, rng.randint(pool * 16 - 15, pool * 16)]
    arrivals = [1, 1] if rng.random() < 0.6 else sorted(rng.randint(1, ROUNDS) for _ in "AB")
    release = rng.choice([None, None, None, 0, 1, 2])
    return {
        "name": "random",
        "page_size": 16,
        "chunked_prefill_size": 64,
        "kv_release_rounds": release,
        "pool": {"free_tokens": pool * 16, "evictable_tokens": 0},
        "requests": [
            {"id": name, "prompt_tokens": p, "arrival_round": a}
            for name, p, a in zip("AB", prompts, arrivals, strict=True)
        ],
    }


def _scheduler_run(data: dict, combo) -> list[list[tuple[int, bool, int]]]:
    """Per step, per request: computed tokens, running, the round it finished in (0: not)."""
    sc = parse_scenario(data)
    sched, _ = prepare(sc, combo)
    reqs = list(sched.node.future)
    out = []
    for _ in range(ROUNDS):
        sched.step()
        running = {r.id for r in sched.node.running}
        out.append([(r.computed, r.id in running, r.finished_round or 0) for r in reqs])
    return out


def _pinned(u, data: dict, run: list) -> list[z3.BoolRef]:
    inp = u.inputs
    facts = [inp.pool_blocks.t == data["pool"]["free_tokens"] // 16]
    release = data["kv_release_rounds"]
    facts.append(inp.release_never == (release is None))
    if release is not None:
        facts.append(inp.release_rounds.t == release)
    for q, spec in zip(inp.requests, data["requests"], strict=True):
        facts += [q.prompt.t == spec["prompt_tokens"], q.arrival.t == spec["arrival_round"]]
    for state, row in zip(u.states, run, strict=True):
        for i, (computed, running, finished) in enumerate(row):
            facts += [
                state.computed[i].t == computed,
                state.running[i] == running,
                state.finished[i].t == finished,
                state.alive,
            ]
    return facts


def _combo(registry, rng: random.Random):
    """Any combo that preempts; half the time one that admits on the first chunk alone and
    caps chunks below the budget, which preempts most."""
    if rng.random() < 0.5:
        chunking = rng.choice(["vllm", "vllm-threshold:16", "vllm-threshold:40"])
        return registry.resolve(f"vllm-no-reserve/{chunking}/none/default/fcfs/vllm", config=CONFIG)
    kinds = (*VERDICT_KINDS, "preemption")
    return rng.choice([c for c in registry.all_combos(CONFIG, kinds=kinds) if c.preempts])


def test_the_random_runs_preempt(registry):
    """The runs below reach what the model is for: preemptions."""
    preempted = 0
    for seed in range(SEEDS):
        rng = random.Random(seed)
        combo = _combo(registry, rng)
        for _ in range(5):
            sched, _ = prepare(parse_scenario(_random_case(rng)), combo)
            preempted += sum(bool(sched.step().preempted) for _ in range(ROUNDS))
    assert preempted >= 5


@pytest.mark.parametrize("seed", range(SEEDS))
def test_every_run_of_the_scheduler_is_a_run_of_the_model(registry, seed):
    rng = random.Random(seed)
    combo = _combo(registry, rng)
    with Encoder() as enc:
        u = unroll(combo, CONFIG, enc, {}, requests=2, rounds=ROUNDS, pool_cap=1 << 12, granule=1)
        for _ in range(5):
            data = _random_case(rng)
            run = _scheduler_run(data, combo)
            solver = z3.Solver()
            solver.add(*enc.facts, *_pinned(u, data, run))
            assert solver.check() == z3.sat, (str(combo), data, run)


def test_the_model_is_not_vacuous(registry):
    """A wrong step is refused: the scheduler's run with one request's progress changed."""
    combo = registry.resolve("vllm/vllm/none/default/fcfs/vllm", config=CONFIG)
    data = _random_case(random.Random(3))
    data["requests"][0].update(prompt_tokens=40, arrival_round=1)
    run = _scheduler_run(data, combo)
    computed, running, finished = run[0][0]
    run[0][0] = (computed + 1, running, finished)
    with Encoder() as enc:
        u = unroll(combo, CONFIG, enc, {}, requests=2, rounds=ROUNDS, pool_cap=1 << 12, granule=1)
        solver = z3.Solver()
        solver.add(*enc.facts, *_pinned(u, data, run))
        assert solver.check() == z3.unsat


def test_vllm_default_is_proved(registry):
    """admitted-completes to the bound; no-starvation for any depth: on a drained node vLLM's
    admission takes any prompt the pool holds."""
    combo = registry.resolve("vllm/vllm/none/default/fcfs/vllm", config=EngineConfig())
    verdicts = check_or_refuse(combo, EngineConfig(), CheckOptions())
    assert [(v.property, v.verdict, v.bound) for v in verdicts] == [
        ("admitted-completes", "proved", "unbounded"),
        ("no-starvation", "proved", "unbounded"),
    ]
    assert verdicts[0].config["page_size"] == 64
    assert verdicts[0].bounds is None and verdicts[1].bounds is None


def _induction_holds(combo, config: EngineConfig) -> bool:
    with Encoder() as enc:
        goal = step_breaks_it(combo, config, enc, {})
        return solve([*enc.facts, goal], CheckOptions().rlimit).result == z3.unsat


@pytest.mark.parametrize(
    "name",
    [
        "vllm-no-reserve/vllm/none/default/fcfs/vllm",  # the rest is not reserved
        "vllm/vllm-threshold:256/none/default/fcfs/vllm",  # a chunk below the budget
        "vllm/vllm/truncation:192/default/fcfs/vllm",  # a chunk cut below the budget
    ],
)
def test_the_completion_induction_does_not_prove_a_violated_combo(registry, name):
    """Each of these is violated (a counterexample replays): the induction must not go through."""
    assert not _induction_holds(registry.resolve(name, config=EngineConfig()), EngineConfig())


def test_where_the_completion_induction_holds_no_scheduler_run_preempts(registry):
    """The invariant, on the scheduler itself: for vLLM's default combo (proved for this
    configuration too) random scenarios never preempt, and after every step at most one
    request is part-way, the blocks the rest of its prompt needs free."""
    combo = registry.resolve("vllm/vllm/none/default/fcfs/vllm", config=CONFIG)
    assert _induction_holds(combo, CONFIG)
    rng, part_way_seen = random.Random(7), 0
    for _ in range(200):
        sched, _ = prepare(parse_scenario(_random_case(rng)), combo)
        for _ in range(12):
            step = sched.step()
            assert not step.preempted
            part_way = [r for r in sched.node.running if 0 < r.computed < r.prompt_tokens]
            assert len(part_way) <= 1 and len(sched.node.running) == len(part_way)
            for r in part_way:
                part_way_seen += 1
                assert -(-r.prompt_tokens // 16) - -(-r.computed // 16) <= step.blocks_free
    assert part_way_seen >= 20


def test_the_starvation_induction_is_not_vacuous(registry):
    """SGLang's admission refuses a prompt the size of the pool even on a drained node, so the
    one-step induction does not go through, and the bounded search finds the starving run."""
    combo = registry.resolve("sglang/sglang/page/default/lpm/vllm", config=EngineConfig())
    (verdict,) = check_or_refuse(combo, EngineConfig(), CheckOptions(properties=("no-starvation",)))
    assert verdict.verdict == "violated" and verdict.counterexample.failure.kind == "starves"


def test_reservation_off_admits_a_request_it_never_completes(registry, tmp_path):
    """The finding: with scheduler_reserve_full_isl=False a request enters on its first chunk,
    preempts itself when the rest does not fit beside KV held for good, and waits forever. The
    exported counterexample replays through ``policykit simulate`` (exit 3)."""
    combo = "vllm-no-reserve/vllm/none/default/fcfs/vllm"
    res = CliRunner().invoke(
        main, ["check", "--combo", combo, "--json", "--export-counterexample", str(tmp_path)]
    )
    assert res.exit_code == 1, res.output
    data = json.loads(res.stdout)
    assert data["schema"] == "policykit.check/1" and data["created"]
    (row,) = [v for v in data["verdicts"] if v["property"] == "admitted-completes"]
    assert row["verdict"] == "violated"
    failure = row["counterexample"]["failure"]
    assert failure["kind"] == "never-completes" and failure["detail"] == "stalled"
    (path,) = tmp_path.glob("*.admitted-completes.json")
    replayed = CliRunner().invoke(main, ["simulate", str(path), "--json"])
    assert replayed.exit_code == 3, replayed.output
    assert failure["request"] in json.loads(replayed.stdout)["unfinished"]


def _found_and_shrunk(combo, prop: str):
    """The solver's counterexample for ``prop`` at the default bounds and the same one shrunk
    (one z3 model for both)."""
    config, options = EngineConfig(), CheckOptions()
    g = options.bounds.granule_for(config)
    with Encoder() as enc:
        u = unroll(combo, config, enc, {}, requests=2, rounds=3, pool_cap=1 << 18, granule=g)
        facts = [*enc.facts, z3.Or(*(v[prop] for v in u.violations))]
        outcome = solve(facts, options.rlimit, unrolled(0))
        assert outcome.result == z3.sat
        found = counterexample(u, outcome.model, prop)
        assert found.failure is not None
        return found, shrunk(u, outcome.model, found, facts, g)


def _size(cx) -> tuple[int, list[int], list[int]]:
    requests = cx.scenario["requests"]
    return (
        cx.scenario["pool"]["free_tokens"],
        [r["prompt_tokens"] for r in requests],
        [r.get("arrival_round", 1) for r in requests],
    )


@pytest.mark.parametrize(
    ("name", "prop"),
    [
        ("vllm-no-reserve/vllm/none/default/fcfs/vllm", "admitted-completes"),
        ("vllm/vllm-threshold:256/none/default/fcfs/vllm", "admitted-completes"),
        ("sglang/sglang/page/default/fcfs/vllm", "no-starvation"),
    ],
)
def test_a_shrunk_counterexample_is_no_larger_and_still_replays(registry, tmp_path, name, prop):
    """Shrinking lowers the pool, the prompts and the timing while the scenario still fails on
    the scheduler and the model still violates the property with those inputs; what it keeps
    replays through ``policykit simulate`` (exit 3)."""
    combo = registry.resolve(name, config=EngineConfig())
    found, small = _found_and_shrunk(combo, prop)
    (pool, prompts, arrivals), (pool0, prompts0, arrivals0) = _size(small), _size(found)
    assert pool <= pool0
    assert all(a <= b for a, b in zip(prompts + arrivals, prompts0 + arrivals0, strict=True))
    assert (pool, prompts, arrivals) != (pool0, prompts0, arrivals0), "nothing shrank"
    assert small.failure is not None and small.failure.kind == found.failure.kind
    path = tmp_path / "small.json"
    path.write_text(json.dumps(small.scenario))
    replayed = CliRunner().invoke(main, ["simulate", str(path), "--json"])
    assert replayed.exit_code == 3, replayed.output
    assert small.failure.request in json.loads(replayed.stdout)["unfinished"]


def test_the_reservation_off_counterexample_shrinks_to_one_page_beside_the_pool(registry):
    """The finding at its smallest: a one-page request finishes and holds its KV; the other,
    the size of the whole pool, enters on the rest of the budget and can never have its last
    page."""
    combo = registry.resolve("vllm-no-reserve/vllm/none/default/fcfs/vllm", config=EngineConfig())
    _, small = _found_and_shrunk(combo, "admitted-completes")
    assert _size(small) == (4096, [64, 4096], [1, 1])
    assert small.scenario["kv_release_rounds"] is None


def test_sglang_admission_on_the_preempting_node_starves_behind_a_prompt_it_never_admits(
    registry,
):
    """SGLang's admission wants a page and a token beyond the prompt: a prompt the size of
    the pool never enters, and fcfs keeps everything behind it waiting on an empty node."""
    combo = registry.resolve("sglang/sglang/page/default/fcfs/vllm", config=EngineConfig())
    options = CheckOptions(properties=("no-starvation",))
    (verdict,) = check_or_refuse(combo, EngineConfig(), options)
    assert verdict.verdict == "violated"
    cx = verdict.counterexample
    assert cx.failure.kind == "starves"
    sc = parse_scenario(cx.scenario)
    blocker = sc.requests[0]
    assert blocker.id != cx.failure.request
    assert blocker.prompt_tokens + 1 + 64 >= sc.free_tokens


def test_check_all_includes_the_combos_that_preempt(registry):
    combos, unfit = _combos(registry, None, EngineConfig())
    preempting = [c for c in combos if c.preempts]
    # 5 admissions, 6 chunkings, 4 alignments, 2 queues (fcfs-skip is refused there), 1
    # victim: priority, vllm-priority and vllm-adaptive are not enumerated (the checker's
    # model has no priorities, arrival times or division by a count)
    assert len(preempting) == 240 and len(combos) - len(preempting) == 108 and not unfit
    assert all(not c.preempts for c in combos[:108])
    # a sliding window is not a configuration of vLLM's node: left out of --all
    windowed, _ = _combos(registry, None, EngineConfig(sliding_window=4096))
    assert not any(c.preempts for c in windowed)


def test_a_sliding_window_check_of_a_combo_that_preempts_is_refused():
    res = CliRunner().invoke(
        main,
        ["check", "--combo", "vllm/vllm/none/default/fcfs/vllm", "--sliding-window", "4096"],
    )
    assert res.exit_code == 2, res.output
    assert "full-attention" in res.output and "Traceback" not in res.output


def test_given_bounds_hold_for_combos_that_preempt():
    res = CliRunner().invoke(
        main,
        [
            "check",
            "--combo",
            "vllm/vllm/page/default/fcfs/vllm",  # admitted-completes: bounded only
            "--rounds",
            "2",
            "--requests",
            "1",
            "--json",
        ],
    )
    assert res.exit_code == 0, res.output
    data = json.loads(res.stdout)
    assert {v["bound"] for v in data["verdicts"]} == {"K=2,N=1", "unbounded"}
    assert data["config"]["preempting_rounds"] == 2


def test_the_sglang_round_model_refuses_a_combo_that_preempts(registry):
    from policykit.spec.checker import check_combo
    from policykit.spec.crossval import PolicyRefused

    combo = registry.resolve("vllm/vllm/none/default/fcfs/vllm", config=EngineConfig())
    with pytest.raises(PolicyRefused, match="check_or_refuse"):
        check_combo(combo, EngineConfig(), CheckOptions())
