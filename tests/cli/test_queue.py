"""The waiting-queue policy kind: order, head-of-line handling, starvation in ``simulate``."""

from __future__ import annotations

import json

import pytest

from policykit.plugin_manager import make_plugin_manager
from policykit.registry import PolicyRegistry, format_combo, parse_combo
from policykit.scenario import build_node, parse_scenario
from policykit.scheduler import Scheduler

#: a head that no node state could ever admit (prompt + the first token > the pool) and a
#: small request behind it that an idle node would admit at once
HEAD_NEVER_FITS = {
    "page_size": 64,
    "chunked_prefill_size": 4096,
    "pool": {"free_tokens": 4096, "evictable_tokens": 0},
    "kv_release_rounds": 1,
    "requests": [{"id": "A", "prompt_tokens": 4096}, {"id": "B", "prompt_tokens": 64}],
}


@pytest.fixture(scope="module")
def registry() -> PolicyRegistry:
    return PolicyRegistry.from_plugins(make_plugin_manager(entry_points=False))


def _run(registry, scenario: dict, combo: str):
    sc = parse_scenario(scenario, source="test")
    chosen = registry.resolve(sc.combo, combo, config=sc.config)
    return Scheduler(build_node(sc), chosen).run(max_rounds=20)


def test_fcfs_lets_a_never_fitting_head_starve_the_queue(registry):
    result = _run(registry, HEAD_NEVER_FITS, "admission=sglang,queue=fcfs")
    assert result.starvation is not None
    assert (result.starvation.round, result.starvation.request) == (1, "B")
    assert result.starvation.head == "A"
    assert result.completed == [] and sorted(result.pending) == ["A", "B"]


def test_fcfs_skip_rejects_the_head_for_good_and_serves_the_rest(registry):
    result = _run(registry, HEAD_NEVER_FITS, "admission=sglang,queue=fcfs-skip")
    assert result.starvation is None
    assert result.completed == ["B"] and list(result.rejected) == ["A"]


def test_lpm_looks_at_the_longest_cached_prefix_first(registry):
    scenario = {
        "page_size": 64,
        "chunked_prefill_size": 4096,
        "pool": {"free_tokens": 8192, "evictable_tokens": 0},
        "kv_release_rounds": 1,
        "requests": [
            {"id": "A", "prompt_tokens": 1024},
            {"id": "B", "prompt_tokens": 1024, "host_prefix_tokens": 256},
            {"id": "C", "prompt_tokens": 1024, "host_prefix_tokens": 512},
        ],
    }
    for queue, order in (("fcfs", ["A", "B", "C"]), ("lpm", ["C", "B", "A"])):
        first = _run(registry, scenario, f"queue={queue}").rounds[0]
        assert [e.request_id for e in first.plan.entries] == order, queue


def test_simulate_reports_starvation_and_exits_3(cli, tmp_path):
    path = tmp_path / "head.json"
    path.write_text(json.dumps({**HEAD_NEVER_FITS, "combo": {"admission": "sglang"}}))
    out = cli("simulate", str(path), "--combo", "queue=fcfs", "--json")
    assert out.exit_code == 3, out.output
    starvation = json.loads(out.stdout)["starvation"]
    assert starvation["request"] == "B" and starvation["head"] == "A"
    text = cli("simulate", str(path), "--combo", "queue=fcfs")
    assert "Waiting request B starves (round 1)" in text.output


@pytest.mark.parametrize(
    "combo",
    [
        {"admission": "sglang", "chunking": "sglang", "alignment": "none"},
        {"admission": "sglang", "chunking": "sglang", "alignment": "none", "queue": "lpm"},
        {"allocator-phase": "expandable", "queue": "fcfs-skip"},
    ],
)
def test_every_printed_combo_parses_back(combo):
    printed = format_combo(combo)
    assert format_combo(parse_combo(printed)) == printed
    if "queue" in combo:
        assert printed.endswith("/" + combo["queue"])
    else:
        assert printed.count("/") == 2


def test_the_starvation_message_says_why_a_blocking_queue_stops(registry):
    message = _run(registry, HEAD_NEVER_FITS, "admission=sglang,queue=fcfs").starvation.message
    assert "stops at A, which can never fit" in message
    assert "'fcfs' queue policy stops at such a request instead of skipping it" in message


def test_the_starvation_message_of_a_skipping_queue_does_not_deny_the_skip(registry, monkeypatch):
    """A policy that claims an idle node would take the head (an admit-all one does) keeps
    ``fcfs-skip`` from skipping it; the message must blame the combo's refusal, not say that
    ``fcfs-skip`` does not skip a request that can never fit (the opposite of what it does)."""
    from policykit.planner import Planner

    real = Planner.never_fits
    monkeypatch.setattr(
        Planner, "never_fits", lambda self, req: None if req.id == "A" else real(self, req)
    )
    result = _run(registry, HEAD_NEVER_FITS, "admission=sglang,queue=fcfs-skip")
    message = result.starvation.message
    assert "does not skip" not in message and "instead of skipping" not in message
    assert "the combo would admit on an idle node" in message
    assert "'fcfs-skip' queue policy stops at a refused request" in message
