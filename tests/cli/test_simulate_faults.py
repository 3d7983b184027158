"""``simulate`` fails a run in which a broken policy failed a request (exit 4), so that a CI
job gating a plugin on ``simulate`` does not pass a policy that raises."""

from __future__ import annotations

import json

import pytest

import policykit
from policykit.cli.simulate_outcome import EXIT_POLICY_FAULT
from policykit.plugin_manager import make_plugin_manager


class RaisingAdmission(policykit.AdmissionPolicy):
    """Raises on every request: a plugin with a bug."""

    name = "raises"

    def admit(self, v):
        raise ZeroDivisionError("division by zero in the author's admit")

    def tail_reserve(self, v):
        return 0


class WrongTypeAdmission(RaisingAdmission):
    """Answers a string where a bool is due: a contract break the planner refuses."""

    name = "wrong-type"

    def admit(self, v):
        return "yes"


class BrokenPlugin:
    @policykit.hookimpl
    def policykit_register_policies(self, register):
        register(RaisingAdmission)
        register(WrongTypeAdmission)


@pytest.fixture(scope="module")
def pm():
    manager = make_plugin_manager(entry_points=False)
    manager.register(BrokenPlugin(), name="broken")
    return manager


@pytest.mark.parametrize("admission", ["raises", "wrong-type"])
def test_a_policy_fault_exits_4_and_says_so_in_json(cli, pm, admission):
    out = cli("simulate", "seed-abc", "--combo", f"admission={admission}", "--json", pm=pm)
    assert out.exit_code == EXIT_POLICY_FAULT == 4, out.output
    data = json.loads(out.stdout)
    faults = data["policy_faults"]
    assert faults and {f["id"] for f in faults} <= {f["id"] for f in data["failed"]}
    assert admission in faults[0]["reason"]


def test_a_policy_fault_is_in_red_under_the_summary(cli, pm):
    out = cli("simulate", "seed-abc", "--combo", "admission=raises", pm=pm)
    assert out.exit_code == 4
    assert "Policy fault (exit 4): a policy failed" in out.output
    assert "ZeroDivisionError" in out.output


def test_the_same_scenario_with_a_working_policy_exits_0(cli, pm):
    assert cli("simulate", "seed-abc", "--combo", "admission=reserve-tail", pm=pm).exit_code == 0


class WordyChunking(policykit.ChunkingPolicy):
    """Answers a chunk length in words."""

    name = "wordy"

    def new_chunk(self, v):
        return "all of it"

    def resume_chunk(self, v):
        return "the rest"


class FloatQueue(policykit.QueuePolicy):
    """Ranks by a float, which would order the queue by accident."""

    name = "floaty"

    def priority(self, v):
        return v.prompt_tokens / 2


class WordyVictim(policykit.PreemptionPolicy):
    """Ranks a victim with a string."""

    name = "wordy-victim"

    def victim_rank(self, v):
        return "last"


class MoreBroken:
    @policykit.hookimpl
    def policykit_register_policies(self, register):
        for cls in (WordyChunking, FloatQueue, WordyVictim):
            register(cls)


@pytest.mark.parametrize(
    ("combo", "method", "cls"),
    [
        ("admission=wrong-type", "admit", WrongTypeAdmission),
        ("admission=raises", "admit", RaisingAdmission),
        ("chunking=wordy", "new_chunk", WordyChunking),
        ("queue=floaty", "priority", FloatQueue),
        ("vllm-no-reserve/vllm/none/default/fcfs/wordy-victim", "victim_rank", WordyVictim),
    ],
)
def test_a_fault_names_the_module_file_and_line_of_the_policy(cli, tmp_path, combo, method, cls):
    """Whatever the kind, the reason sends the author to their own module and line."""
    manager = make_plugin_manager(entry_points=False)
    manager.register(BrokenPlugin(), name="broken")
    manager.register(MoreBroken(), name="more-broken")
    scenario = "seed-abc" if "wordy-victim" not in combo else _preempting_scenario(tmp_path)
    out = cli("simulate", scenario, "--combo", combo, "--json", pm=manager)
    assert out.exit_code == EXIT_POLICY_FAULT, out.output
    data = json.loads(out.stdout)
    # the node that preempts stops at its one fault (policykit.simulate.preempting/1)
    said = data["policy_faults"][0]["reason"] if "policy_faults" in data else data["policy_fault"]
    reason = " ".join(said.split())
    line = getattr(cls, method).__code__.co_firstlineno
    assert f"module {__name__}, {method}() at " in reason, reason
    assert f"test_simulate_faults.py:{line}" in reason, reason


def _preempting_scenario(folder) -> str:
    """Two requests whose blocks do not all fit: the second's next chunk preempts."""
    doc = {
        "page_size": 16,
        "chunked_prefill_size": 64,
        "kv_release_rounds": None,
        "pool": {"free_tokens": 64, "evictable_tokens": 0},
        "requests": [
            {"id": "A", "prompt_tokens": 48, "arrival_round": 1},
            {"id": "B", "prompt_tokens": 48, "arrival_round": 1},
        ],
    }
    path = folder / "preempts.json"
    path.write_text(json.dumps(doc))
    return str(path)
