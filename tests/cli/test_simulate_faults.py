"""``simulate`` fails a run in which a broken policy failed a request (exit 4), so that a CI
job gating a plugin on ``simulate`` does not pass a policy that raises."""

from __future__ import annotations

import json

import pytest

import policykit
from policykit.cli.simulate import EXIT_POLICY_FAULT
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
