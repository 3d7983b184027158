"""``policykit sglang-plugin --check`` and ``policykit check`` answer the same for the same combo
string, and the plugin check's small things: defaults, the missing-SGLang line, blank combos."""

from __future__ import annotations

import json

import pytest

from policykit.cli.check import check as check_command
from policykit.cli.sglang_plugin import sglang_plugin
from policykit.integrations.sglang import check as plugin_check


def _check_verdicts(cli, combo: str) -> dict[str, str]:
    out = cli("check", "--combo", combo, "--json")
    return {r["property"]: r["verdict"] for r in json.loads(out.stdout)["verdicts"]}


def _plugin(cli, combo: str, *extra: str):
    out = cli("sglang-plugin", "--check", "--combo", combo, "--json", *extra)
    return out, json.loads(out.stdout)


@pytest.mark.parametrize(
    "combo", ["sglang/sglang/checkpoint:256", "reserve-tail/sglang/checkpoint:256"]
)
def test_check_and_the_plugin_check_agree_on_the_same_combo_string(cli, combo):
    _, doc = _plugin(cli, combo)
    plugin = {v["property"]: v["verdict"] for v in doc["verdicts"]}
    assert plugin == _check_verdicts(cli, combo)
    assert not doc["checked_as_sglang_runs"]


def test_the_incident_combo_starves_in_both(cli):
    """SGLang runs ``fcfs``: a request that can never fit blocks the queue."""
    assert _check_verdicts(cli, "sglang/sglang/checkpoint:256")["no-starvation"] == "violated"


def test_a_skipping_queue_is_checked_as_sglang_runs_it_and_says_so(cli):
    _, doc = _plugin(cli, "reserve-tail/sglang/page/default/fcfs-skip")
    plugin = {v["property"]: v["verdict"] for v in doc["verdicts"]}
    assert doc["checked_as_sglang_runs"]
    assert plugin == _check_verdicts(cli, "reserve-tail/sglang/page")
    assert _check_verdicts(cli, "reserve-tail/sglang/page/default/fcfs-skip")["no-starvation"] == (
        "proved"
    )


def _default(command, name: str):
    return next(p.default for p in command.params if p.name == name)


def test_the_engine_defaults_are_the_same_in_both_commands():
    for name in ("page_size", "chunked_prefill_size"):
        assert _default(sglang_plugin, name) == _default(check_command, name), name


def test_without_sglang_one_line_says_how_to_install_it(cli, monkeypatch):
    monkeypatch.setattr(plugin_check, "installed_version", lambda: None)
    out = cli("sglang-plugin", "--check", "--combo", "reserve-tail/sglang/page", "--no-prove")
    assert out.exit_code == 1
    fails = [line for line in out.output.splitlines() if line.startswith("FAIL")]
    assert len(fails) == 1, out.output
    assert "pip install 'policykit[sglang]' && pip install --no-deps sglang==" in out.output


@pytest.mark.parametrize(
    "args",
    [
        ["check", "--combo", ""],
        ["check", "--combo", "  "],
        ["simulate", "seed-abc", "--combo", ""],
        ["bench", "--workload", "seed-abc", "--device", "cpu", "--combo", ""],
        ["sglang-plugin", "--check", "--no-prove", "--combo", ""],
    ],
)
def test_a_blank_combo_is_bad_input_not_the_defaults(cli, args):
    out = cli(*args)
    assert out.exit_code == 2, out.output
    assert "names no combination" in out.output and "Traceback" not in out.output
