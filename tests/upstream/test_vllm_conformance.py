"""``policykit conformance vllm``: policykit's vLLM combo against vLLM 0.33.0's real scheduler.

At least 300 random scenarios (with preemptions, the long-prefill threshold and full-sequence
reservation off among them, and the layout's classes: cached filler, several device prefixes,
requests in progress, block sizes to 64) and hand-made edge cases must be identical round by
round; the layout before round 1 on both sides; the command's exit codes and ``--json``. Skips
cleanly without the ``vllm`` extra.
"""

from __future__ import annotations

import json
import random

import pytest
from click.testing import CliRunner

from policykit.cli import main
from policykit.scenario import parse_scenario


@pytest.fixture(scope="module")
def compare(vllm_oracle):
    from policykit.conformance.vllm import compare

    return compare


def scenario(requests, *, pool=160, chunk=64, release=None, evictable=0, page=16):
    return parse_scenario(
        {
            "name": "edge",
            "page_size": page,
            "chunked_prefill_size": chunk,
            "pool": {"free_tokens": pool, "evictable_tokens": evictable},
            "kv_release_rounds": release,
            "requests": requests,
        }
    )


@pytest.mark.slow
def test_300_random_scenarios_are_identical(compare):
    rng = random.Random(1)
    runs = [compare.random_scenario(rng, i) for i in range(300)]
    verdicts = [compare.conform(sc, knobs) for sc, knobs in runs]
    assert [(v.scenario, v.differences) for v in verdicts if v.differences] == []
    # the scenarios reach what the comparison is for
    assert sum(v.preemptions > 0 for v in verdicts) >= 20
    assert sum(k.long_prefill_token_threshold > 0 for _, k in runs) >= 50
    assert sum(not k.scheduler_reserve_full_isl for _, k in runs) >= 50
    assert sum(k.scheduling_policy == "priority" for _, k in runs) >= 30
    # and the layout's classes: filler, prefixes whose warm-up order a threshold or no
    # reservation would have changed, requests in progress, every block size
    covered = compare.coverage(runs, verdicts)
    assert covered["filler"] >= 50 and covered["in_progress"] >= 30
    assert covered["prefixes_under_threshold"] >= 20
    assert covered["prefixes_without_reservation"] >= 20
    assert all(covered["block_size"][str(size)] >= 30 for size in (16, 32, 48, 64))


TWO_LONG = [{"id": "A", "prompt_tokens": 120}, {"id": "B", "prompt_tokens": 120}]
EDGES = {
    # B preempts itself (running[-1]) and comes back with a prefix-cache hit
    "self-preemption": (scenario(TWO_LONG, release=0), {"long_prefill_token_threshold": 32}),
    # A enters on its first chunk while B's finished KV is still held; its next chunk does not
    # fit, so it preempts itself, and comes back once B's transfer is done
    "reservation-off": (
        scenario(
            [
                {"id": "A", "prompt_tokens": 120, "arrival_round": 2},
                {"id": "B", "prompt_tokens": 120, "arrival_round": 1},
            ],
            chunk=32,
            release=3,
        ),
        {"scheduler_reserve_full_isl": False},
    ),
    # several preemptions in one step: the three later requests lose their blocks to A
    "chain": (
        scenario([{"id": x, "prompt_tokens": 70} for x in "ABCD"], pool=192, chunk=96, release=1),
        {"scheduler_reserve_full_isl": False, "long_prefill_token_threshold": 17},
    ),
    # the threshold is lifted for a lone request
    "threshold-alone": (
        scenario([{"id": "A", "prompt_tokens": 100}], pool=320),
        {"long_prefill_token_threshold": 32},
    ),
    # a prompt that can never fit: both sides stop once nothing can change
    "never-fits": (scenario([{"id": "A", "prompt_tokens": 200}]), {}),
    # pinned and evictable device prefixes, KV held for the whole run
    "prefixes": (
        scenario(
            [
                {"id": "A", "prompt_tokens": 100, "device_prefix_tokens": 32},
                {
                    "id": "B",
                    "prompt_tokens": 40,
                    "device_prefix_tokens": 16,
                    "device_prefix_pinned": True,
                },
                {"id": "C", "prompt_tokens": 90, "arrival_round": 2},
            ],
            evictable=32,
        ),
        {"scheduler_reserve_full_isl": False},
    ),
    # one-token blocks, a prompt a whole number of blocks long (its last block is recomputed)
    "page-1": (
        scenario(
            [
                {"id": "A", "prompt_tokens": 32, "device_prefix_tokens": 31},
                {"id": "B", "prompt_tokens": 7},
            ],
            pool=8,
            evictable=31,
            chunk=8,
            page=1,
            release=2,
        ),
        {},
    ),
}


@pytest.mark.parametrize("name", sorted(EDGES))
def test_edge_cases_are_identical(compare, name):
    from policykit.conformance.vllm import SchedulerKnobs

    sc, knobs = EDGES[name]
    verdict = compare.conform(sc, SchedulerKnobs(**knobs))
    assert verdict.differences == []
    if name in ("self-preemption", "reservation-off", "chain"):
        assert verdict.preemptions > 0


def test_the_command_reports_json_with_schema_and_coverage(compare):
    res = CliRunner().invoke(
        main, ["conformance", "vllm", "--random", "20", "--seed", "1", "--json"]
    )
    assert res.exit_code == 0, res.output
    data = json.loads(res.stdout)
    assert data["schema"] == "policykit.conformance.vllm/1" and data["created"]
    assert data["engine"] == "vllm==0.33.0" and data["seed"] == 1
    assert data["identical"] == 20 and data["different"] == 0
    assert set(data["coverage"]) >= {"preemption", "long_prefill_threshold", "in_progress"}
    assert set(data["coverage"]) >= {"filler", "prefixes_under_threshold", "block_size"}
    assert data["settings"] == {}


def test_settings_given_hold_for_the_random_scenarios(compare):
    args = ["conformance", "vllm", "--random", "10", "--seed", "2", "--json"]
    args += ["--long-prefill-token-threshold", "8", "--no-reserve-full-isl"]
    res = CliRunner().invoke(main, args)
    assert res.exit_code == 0, res.output
    data = json.loads(res.stdout)
    assert data["settings"] == {
        "long_prefill_token_threshold": 8,
        "scheduler_reserve_full_isl": False,
    }
    assert {v["combo"] for v in data["scenarios"]} == {
        "vllm-no-reserve/vllm-threshold:8/none/default/fcfs/vllm"
    }
    assert data["coverage"]["long_prefill_threshold"] == 10


def test_a_difference_exits_1_and_names_the_round(compare, monkeypatch, tmp_path):
    path = tmp_path / "two.json"
    path.write_text(json.dumps(scenario(TWO_LONG, chunk=48, release=0).to_dict()))
    # policykit's side made to reserve while vLLM does not: they part in round 3
    monkeypatch.setattr(compare, "vllm_combo", lambda knobs: "vllm/vllm/none/default/fcfs/vllm")
    res = CliRunner().invoke(main, ["conformance", "vllm", str(path), "--no-reserve-full-isl"])
    assert res.exit_code == 1, res.output
    assert "round 3: scheduled" in res.stdout


def test_an_unmappable_scenario_is_bad_input(compare, tmp_path):
    path = tmp_path / "hosted.json"
    data = scenario([{"id": "A", "prompt_tokens": 100}]).to_dict()
    data["requests"][0]["host_prefix_tokens"] = 16
    path.write_text(json.dumps(data))
    res = CliRunner().invoke(main, ["conformance", "vllm", str(path)])
    assert res.exit_code == 2 and "host tier" in res.output and "Traceback" not in res.output


def test_an_admitted_request_that_can_never_complete_stalls_alike(compare):
    # B's KV is held for good (8 of 10 blocks). Without full-sequence reservation A enters on
    # its first chunk, cannot grow, preempts itself, enters again with its cached blocks, and
    # then waits forever: vLLM 0.33.0 admits a request it can never complete. With
    # reservation on, A is never admitted.
    from policykit.conformance.vllm import SchedulerKnobs, drive

    requests = [
        {"id": "B", "prompt_tokens": 120, "arrival_round": 1},
        {"id": "A", "prompt_tokens": 120, "arrival_round": 2},
    ]
    sc = scenario(requests, chunk=32)
    off = SchedulerKnobs(scheduler_reserve_full_isl=False)
    assert compare.conform(sc, off).differences == []
    trace = drive(sc, off)
    assert trace.preemptions() == [(5, "A"), (7, "A")] and trace.unfinished == ["A"]
    assert compare.conform(sc).differences == []
    assert "A" not in {rid for s in drive(sc).steps for rid in s.scheduled}


# --- the layout before round 1 (docs/conformance-vllm.md, "Before round 1") --------------------
def _simulate(tmp_path, sc, combo):
    """``policykit simulate SCENARIO --combo COMBO --json``: the rounds of policykit's node."""
    path = tmp_path / f"{sc.name}.json"
    path.write_text(json.dumps(sc.to_dict()))
    res = CliRunner().invoke(main, ["simulate", str(path), "--combo", combo, "--json"])
    assert res.exit_code in (0, 3), res.output
    return [(r["round"], r["scheduled"], r["preempted"]) for r in json.loads(res.stdout)["rounds"]]


def _vllm_rounds(trace):
    return [(s.round, s.scheduled, s.preempted) for s in trace.steps]


def _free_queue(trace_scheduler):
    """vLLM's free queue, head (evicted first) to tail: whether each block caches content."""
    queue = trace_scheduler.kv_cache_manager.block_pool.free_block_queue
    return [block.block_hash is not None for block in queue.get_all_free_blocks()]


def test_filler_is_cached_content_evicted_before_the_prefixes(compare, tmp_path, monkeypatch):
    # 3 blocks, none free: A's 2-block unpinned prefix and 1 block of filler (cached content of
    # no request). The filler was freed before A's prefix, so C (1 block, arriving first)
    # evicts it, not A's tail block: in round 2 A hits its whole 32-token prefix and computes
    # the 16 tokens left, on vLLM's real scheduler and in `policykit simulate` alike
    from policykit.conformance.vllm import SchedulerKnobs, driver

    sc = scenario(
        [
            {"id": "C", "prompt_tokens": 16},
            {"id": "A", "prompt_tokens": 48, "device_prefix_tokens": 32, "arrival_round": 2},
        ],
        pool=0,
        evictable=48,
        release=1,
    )
    queues = []
    lay_out = driver._lay_out

    def spy(run, *args):
        steps = lay_out(run, *args)
        queues.append(_free_queue(run.scheduler))
        return steps

    monkeypatch.setattr(driver, "_lay_out", spy)
    trace = driver.drive(sc, SchedulerKnobs())
    assert queues == [[True, True, True]]  # filler and A's prefix, all cached: nothing free
    assert _vllm_rounds(trace)[:2] == [(1, {"C": 16}, []), (2, {"A": 16}, [])]
    assert _simulate(tmp_path, sc, "vllm/vllm/none/default/fcfs/vllm") == _vllm_rounds(trace)


def test_device_prefixes_are_warmed_alone_whatever_the_threshold(compare, tmp_path):
    # A's and B's prefixes are computed one after another, each alone, then freed in that
    # order: A's blocks are older, so C's first block evicts A's tail and A enters in round 1
    # on its first 16 tokens. Warmed together under the threshold of 8, B's 1-block prefix
    # would finish first and be evicted instead, and A would not fit in round 1.
    from policykit.conformance.vllm import SchedulerKnobs, drive

    sc = scenario(
        [
            {"id": "C", "prompt_tokens": 28},
            {"id": "A", "prompt_tokens": 43, "device_prefix_tokens": 32},
            {"id": "B", "prompt_tokens": 27, "device_prefix_tokens": 16},
        ],
        pool=0,
        evictable=48,
        chunk=48,
        release=1,
    )
    knobs = SchedulerKnobs(long_prefill_token_threshold=8, scheduler_reserve_full_isl=False)
    rounds = _vllm_rounds(drive(sc, knobs))
    assert rounds[0] == (1, {"C": 8, "A": 8}, [])
    combo = compare.vllm_combo(knobs)
    assert combo == "vllm-no-reserve/vllm-threshold:8/none/default/fcfs/vllm"
    assert _simulate(tmp_path, sc, combo) == rounds
    assert compare.conform(sc, knobs).differences == []


@pytest.mark.parametrize(
    ("prefix", "pinned", "computed"), [(0, False, 40), (32, False, 40), (32, True, 48)]
)
def test_a_request_in_progress_is_running_as_in_vllm(
    compare, monkeypatch, prefix, pinned, computed
):
    # B has computed `computed` tokens (its device prefix a cache hit among them): vLLM holds
    # it first in its running list, with that many tokens computed and their blocks, and both
    # sides resume it first in round 1 with the rest of its prompt
    from policykit.conformance.vllm import SchedulerKnobs, driver

    b = {"id": "B", "prompt_tokens": 100, "computed_tokens": computed, "chunked": True}
    if prefix:
        b.update(device_prefix_tokens=prefix, device_prefix_pinned=pinned)
    sc = scenario(
        [{"id": "A", "prompt_tokens": 30}, b],
        pool=64,
        evictable=prefix if not pinned else 0,
        chunk=48,
        release=1,
    )
    held = []
    lay_out = driver._lay_out

    def spy(run, *args):
        steps = lay_out(run, *args)
        sched = run.scheduler
        request = sched.requests["B"]
        blocks = sched.kv_cache_manager.get_blocks("B").blocks[0]
        held.append(
            ([r.request_id for r in sched.running], request.num_computed_tokens, len(blocks))
        )
        return steps

    monkeypatch.setattr(driver, "_lay_out", spy)
    trace = driver.drive(sc, SchedulerKnobs())
    assert held == [(["B"], computed, -(-computed // 16))]
    assert trace.steps[0].scheduled == {"B": 48 if 100 - computed > 48 else 100 - computed}
    assert compare.conform(sc, SchedulerKnobs()).differences == []
