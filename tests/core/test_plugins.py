"""Third-party policies: registered at run time or through the ``policykit`` entry point."""

from __future__ import annotations

import json
import sys
import textwrap

import pytest
from click.testing import CliRunner

import policykit
from policykit.cli import main
from policykit.errors import PluginError
from policykit.plugin_manager import make_plugin_manager
from policykit.registry import PolicyRegistry


class GreedyTail(policykit.AdmissionPolicy):
    """Reserve-tail with one extra page of margin."""

    name = "greedy-tail"

    def admit(self, v):
        return v.remaining_tokens + v.first_tokens + v.page_size < v.rem_total_tokens

    def tail_reserve(self, v):
        return policykit.ceil_paged(v.tail_tokens, v.page_size) + v.first_tokens + v.page_size


class RuntimePlugin:
    @policykit.hookimpl
    def policykit_register_policies(self, register):
        register(GreedyTail)


def invoke(args, pm=None):
    return CliRunner().invoke(main, args, obj={"pm": pm} if pm else None)


def test_runtime_registered_policy_is_listed_and_usable():
    pm = make_plugin_manager(entry_points=False)
    pm.register(RuntimePlugin(), name="runtime-test")
    listed = invoke(["policies", "--json"], pm)
    assert listed.exit_code == 0
    names = {(p["kind"], p["name"]) for p in json.loads(listed.stdout)["policies"]}
    assert ("admission", "greedy-tail") in names
    run = invoke(
        [
            "simulate",
            "seed-incident-1keim",
            "--json",
            "--combo",
            "admission=greedy-tail,alignment=checkpoint:256",
        ],
        pm,
    )
    assert run.exit_code == 0, run.output
    assert json.loads(run.stdout)["combo"]["admission"] == "greedy-tail"


@pytest.fixture
def installed_plugin(tmp_path, monkeypatch):
    """A distribution on sys.path whose entry point registers a chunking policy."""
    pkg = tmp_path / "tinychunk_policy.py"
    pkg.write_text(
        textwrap.dedent('''
        import policykit

        class Halves(policykit.ChunkingPolicy):
            """Resume with half the budget, never more."""
            name = "halves"
            def new_chunk(self, v):
                return min(v.remaining_tokens, v.rem_chunk_tokens // v.page_size * v.page_size)
            def resume_chunk(self, v):
                return min(v.remaining_tokens, max(v.rem_total_tokens // 2, 0))

        @policykit.hookimpl
        def policykit_register_policies(register):
            register(Halves)
    ''')
    )
    dist = tmp_path / "tinychunk_policy-1.2.3.dist-info"
    dist.mkdir()
    (dist / "METADATA").write_text(
        "Metadata-Version: 2.1\nName: tinychunk-policy\nVersion: 1.2.3\n"
    )
    (dist / "entry_points.txt").write_text("[policykit]\ntinychunk = tinychunk_policy\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    yield
    sys.modules.pop("tinychunk_policy", None)


def test_entry_point_policy_is_listed_with_its_distribution(installed_plugin):
    listed = invoke(["policies", "--json"])
    assert listed.exit_code == 0
    (row,) = [p for p in json.loads(listed.stdout)["policies"] if p["name"] == "halves"]
    assert row["source"] == "tinychunk-policy 1.2.3"
    run = invoke(["simulate", "seed-abc", "--json", "--combo", "chunking=halves"])
    assert run.exit_code in (0, 1), run.output
    assert json.loads(run.stdout)["combo"]["chunking"] == "halves"


def test_plugins_lists_distribution_version_hooks_and_policies(installed_plugin):
    listed = invoke(["plugins", "--json"])
    assert listed.exit_code == 0, listed.output
    doc = json.loads(listed.stdout)
    assert doc["schema"] == "policykit.plugins/1" and doc["created"]
    rows = {row["plugin"]: row for row in doc["plugins"]}
    assert rows["tinychunk"] == {
        "plugin": "tinychunk",
        "distribution": "tinychunk-policy",
        "version": "1.2.3",
        "built_in": False,
        "hooks": ["policykit_register_policies"],
        "policies": ["chunking:halves"],
    }
    assert rows["policykit.plugins.admission"]["built_in"] is True
    text = invoke(["plugins"])
    assert text.exit_code == 0
    assert "tinychunk (tinychunk-policy 1.2.3)" in text.output
    assert "chunking:  halves" in text.output


def test_plugins_shows_observer_hooks():
    class Observer:
        @policykit.hookimpl
        def policykit_round_end(self, round_no, plan):
            pass

    pm = make_plugin_manager(entry_points=False)
    pm.register(Observer(), name="observer")
    doc = json.loads(invoke(["plugins", "--json"], pm).stdout)
    (row,) = [r for r in doc["plugins"] if r["plugin"] == "observer"]
    assert row["hooks"] == ["policykit_round_end"] and row["policies"] == []


def test_blocked_plugin_is_not_loaded(installed_plugin, monkeypatch):
    monkeypatch.setenv("POLICYKIT_BLOCK_PLUGINS", "tinychunk")
    names = {e.name for e in PolicyRegistry.from_plugins(make_plugin_manager()).entries()}
    assert "halves" not in names


def test_plugin_failing_to_import_is_named(tmp_path, monkeypatch):
    (tmp_path / "broken_policy.py").write_text("raise ImportError('no such kernel')\n")
    dist = tmp_path / "broken_policy-0.1.dist-info"
    dist.mkdir()
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: broken-policy\nVersion: 0.1\n")
    (dist / "entry_points.txt").write_text("[policykit]\nbroken = broken_policy\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    with pytest.raises(PluginError, match=r"'broken'.*broken-policy 0\.1.*no such kernel"):
        make_plugin_manager()
    result = invoke(["policies"])
    assert result.exit_code == 2
    assert "broken-policy" in result.output and "Traceback" not in result.output


@pytest.mark.parametrize(
    ("registered", "message"),
    [
        (int, "not a policy class"),
        (type("Nameless", (policykit.AdmissionPolicy,), {"name": ""}), "with the name ''"),
        (type("Slash", (policykit.AdmissionPolicy,), {"name": "a/b"}), "separate the parts"),
        (type("Plus", (policykit.AdmissionPolicy,), {"name": "a+b"}), "separate the parts"),
        (type("Dup", (policykit.AdmissionPolicy,), {"name": "sglang"}), "already registered"),
    ],
)
def test_invalid_registration_names_the_plugin(registered, message):
    class Bad:
        @policykit.hookimpl
        def policykit_register_policies(self, register):
            register(registered)

    pm = make_plugin_manager(entry_points=False)
    pm.register(Bad(), name="bad-plugin")
    with pytest.raises(PluginError, match=f"bad-plugin.*{message}"):
        PolicyRegistry.from_plugins(pm)


def test_plugin_raising_while_registering_gives_exit_2():
    class Raises:
        @policykit.hookimpl
        def policykit_register_policies(self, register):
            raise RuntimeError("boom")

    pm = make_plugin_manager(entry_points=False)
    pm.register(Raises(), name="raises")
    result = invoke(["simulate", "seed-abc"], pm)
    assert result.exit_code == 2
    assert "'raises'" in result.output and "boom" in result.output
    assert "Traceback" not in result.output
