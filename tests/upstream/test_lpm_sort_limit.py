"""``lpm`` over 128 waiting requests, against SGLang 0.5.23's real ``SchedulePolicy``.

Upstream's ``SchedulePolicy._determine_active_policy`` turns ``lpm`` into ``fcfs`` when the
waiting queue holds more than ``WAITING_QUEUE_PREFIX_MATCH_MAX`` (128) requests: no prefix
matching, no sort, the queue keeps its last sort's order with new arrivals at the back.
policykit's ``lpm`` declares the same limit (``sort_limit``); these scenarios put queues on
both sides of it, and the driver runs upstream's own ``calc_priority`` and ``PrefillAdder``.
Skipped without the ``policykit[sglang]`` extra.
"""

from __future__ import annotations

import importlib.util

import pytest

if importlib.util.find_spec("sglang") is None:
    pytest.skip("the policykit[sglang] extra is not installed", allow_module_level=True)

from policykit.conformance.sglang.compare import conform, diff, run_policykit, upstream_combo
from policykit.conformance.sglang.run import drive
from policykit.integrations.sglang.plugin import applied
from policykit.plugins.queue import LongestPrefixQueue
from policykit.registry import registry_from
from policykit.scenario import Scenario, build_node, parse_scenario
from policykit.scheduler import Scheduler

pytestmark = pytest.mark.usefixtures("upstream")

LPM = upstream_combo("lpm")


def queue_scenario(waiting: int, late: int = 0, third: bool = False) -> Scenario:
    """``waiting`` 256-token requests in round 1, the last two (three) with cached prefixes of
    768, 512 (and 448) tokens, so that a sort puts them first; ``late`` more arrive in round
    2. A 512-token chunk admits one of them whole and the next truncated each round."""
    reqs: list[dict] = [{"id": f"r{i:03d}", "prompt_tokens": 256} for i in range(waiting)]
    prefixes = (768, 512, 448) if third else (768, 512)
    for back, prefix in enumerate(prefixes, start=1):
        rid = f"r{waiting - back:03d}"
        reqs[-back] = {"id": rid, "prompt_tokens": 1024, "device_prefix_tokens": prefix}
    reqs += [{"id": f"s{i:03d}", "prompt_tokens": 256, "arrival_round": 2} for i in range(late)]
    return parse_scenario(
        {
            "page_size": 64,
            "chunked_prefill_size": 512,
            "pool": {"free_tokens": 1 << 20, "evictable_tokens": 4096},
            "kv_release_rounds": 1,
            "requests": reqs,
        }
    )


def first_batches(scenario: Scenario, rounds: int) -> list[list[str]]:
    run = run_policykit(scenario, LPM)
    return [[e.request_id for e in r.plan.entries] for r in run.rounds[:rounds]]


def test_the_limit_is_upstreams_constant_and_rule(upstream):
    """The constant, and the rule: over the limit upstream's active policy is ``fcfs``."""
    sp = upstream["schedule_policy"]
    assert LongestPrefixQueue.sort_limit == sp.WAITING_QUEUE_PREFIX_MATCH_MAX == 128
    cache = type("Cache", (), {"disable": False})()  # a tree cache that is on
    schedule = sp.SchedulePolicy("lpm", cache, False, False, False)
    limit = LongestPrefixQueue.sort_limit
    assert schedule._determine_active_policy([None] * limit) is sp.CacheAwarePolicy.LPM
    assert schedule._determine_active_policy([None] * (limit + 1)) is sp.CacheAgnosticPolicy.FCFS
    assert LongestPrefixQueue().sorts(limit) and not LongestPrefixQueue().sorts(limit + 1)


@pytest.mark.parametrize(
    "waiting, late, third, expected",
    [
        # at the limit both sides sort: the cached prefixes go first
        (128, 0, False, [["r127", "r126"], ["r126", "r000"]]),
        # over it neither sorts: arrival order in round 1, the prefixes only once it shrinks
        (129, 0, False, [["r000", "r001"], ["r128", "r127"]]),
        # sorted in round 1 (100 waiting), over the limit in round 2 (137): r097 keeps the
        # place round 1's sort gave it, ahead of r000, and the arrivals queue behind
        (100, 40, True, [["r099", "r098"], ["r098", "r097"], ["r097", "r000"]]),
    ],
)
def test_lpm_decides_as_upstreams_schedule_policy(waiting, late, third, expected):
    scenario = queue_scenario(waiting, late, third)
    verdict = conform(scenario, LPM, schedule_policy="lpm")
    assert verdict.identical, verdict.differences[:3]
    assert first_batches(scenario, len(expected)) == expected


@pytest.mark.parametrize("engine", ["fcfs", pytest.param("lpm", marks=pytest.mark.slow)])
def test_the_plugin_keeps_an_over_limit_queue_as_simulate_does(engine):
    """In SGLang under the plugin (``queue=lpm``), whatever ``--schedule-policy`` it runs."""
    combo = registry_from().resolve(LPM)
    for scenario in (queue_scenario(129), queue_scenario(100, 40, third=True)):
        with applied(combo):
            theirs = drive(scenario, max_rounds=400, schedule_policy=engine)
        ours = Scheduler(build_node(scenario), combo, fail_stuck=False).run(400)
        assert not diff(ours, theirs), diff(ours, theirs)[:3]
