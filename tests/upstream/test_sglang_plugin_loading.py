"""How the policykit SGLang plugin is found, enabled, refused and checked.

The ``load_plugins`` tests need SGLang's scheduler modules (skipped without the extra); the
settings, start-up and CLI tests need only policykit.
"""

from __future__ import annotations

import importlib.metadata
import importlib.util
import json
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest
from click.testing import CliRunner

from policykit.cli import main
from policykit.integrations.sglang import check, hooks, plugin, settings, startup
from policykit.registry import registry_from

HAS_SGLANG = importlib.util.find_spec("sglang") is not None
needs_sglang = pytest.mark.skipif(not HAS_SGLANG, reason="the policykit[sglang] extra is absent")


@pytest.fixture
def sglang_plugins(monkeypatch):
    """SGLang's ``load_plugins`` ready to run again; upstream's methods restored afterwards."""
    from policykit.conformance.sglang.driver import UpstreamUnavailable, load

    try:
        load()
    except UpstreamUnavailable as exc:
        pytest.skip(str(exc))
    import sglang.srt.plugins as plugins
    from sglang.srt.plugins.hook_registry import HookRegistry

    saved = plugin.decision_methods()
    monkeypatch.setattr(plugins, "_plugins_loaded", False)
    HookRegistry.reset()
    yield plugins, saved
    plugin.restore(saved)
    scheduler = sys.modules.get("sglang.srt.managers.scheduler")
    init = getattr(getattr(scheduler, "Scheduler", None), "__init__", None)
    if hasattr(init, "__wrapped__"):
        scheduler.Scheduler.__init__ = init.__wrapped__
    HookRegistry.reset()
    hooks.activate(None)


@needs_sglang
def test_load_plugins_finds_the_entry_point_and_hooks_land(sglang_plugins, monkeypatch):
    plugins, saved = sglang_plugins
    monkeypatch.setenv("SGLANG_PLUGINS", "policykit")
    monkeypatch.setenv("POLICYKIT_COMBO", "admission=reserve-tail,chunking=defer")
    plugins.load_plugins()
    assert len(saved) == 4
    for (cls, name), original in saved.items():
        assert cls.__dict__[name] is not original
        assert cls.__dict__[name].__wrapped__ is original
    assert str(hooks.active()).startswith("reserve-tail/defer")


@needs_sglang
def test_a_third_party_policy_found_by_its_entry_point_decides_in_the_engine(
    sglang_plugins, monkeypatch
):
    """A policy from another distribution's ``policykit`` entry point is the one the engine
    asks: its own class, unmodified."""
    from policykit.conformance.sglang.run import drive
    from policykit.scenario import load_scenario
    from tests.spec import custom_policies

    plugins, _ = sglang_plugins
    installed = importlib.metadata.entry_points
    acme = importlib.metadata.EntryPoint("acme-policies", custom_policies.__name__, "policykit")

    def entry_points(**selection):
        found = installed(**selection)
        return [*found, acme] if selection.get("group") == "policykit" else found

    monkeypatch.setattr(importlib.metadata, "entry_points", entry_points)
    monkeypatch.setenv("SGLANG_PLUGINS", "policykit")
    monkeypatch.setenv("POLICYKIT_COMBO", "admission=paged-reserve")
    plugins.load_plugins()
    admission = hooks.active().admission
    assert type(admission) is custom_policies.PagedReserve
    asked: list = []
    decide = custom_policies.PagedReserve.admit
    monkeypatch.setattr(
        custom_policies.PagedReserve, "admit", lambda self, v: asked.append(v) or decide(self, v)
    )
    root = Path(__file__).resolve().parents[2]
    run = drive(load_scenario(root / "policykit" / "scenarios" / "seed-incident-1keim.json"))
    assert asked and run.rounds


@needs_sglang
@pytest.mark.parametrize("allow_list", ["", "some-other-plugin"])
def test_without_policykit_in_sglang_plugins_nothing_is_hooked(
    sglang_plugins, monkeypatch, allow_list
):
    plugins, saved = sglang_plugins
    monkeypatch.setenv("SGLANG_PLUGINS", allow_list)
    monkeypatch.setenv("POLICYKIT_COMBO", "admission=reserve-tail")
    plugins.load_plugins()
    for (cls, name), original in saved.items():
        assert cls.__dict__[name] is original
    assert hooks.active() is None


def test_an_unknown_policy_stops_the_process_at_plugin_load(monkeypatch):
    monkeypatch.setenv("SGLANG_PLUGINS", "policykit")
    monkeypatch.setenv("POLICYKIT_COMBO", "admission=no-such-policy")
    with pytest.raises(SystemExit) as exc:
        plugin.load()
    assert "refuses to start" in str(exc.value) and "no-such-policy" in str(exc.value)
    assert hooks.active() is None


def scheduler_with(**args) -> SimpleNamespace:
    """A constructed ``Scheduler`` as the start-up hook reads it: SGLang 0.5.23's default server
    args on a 64-token-page, 4096-chunk engine, with ``args`` changed."""
    defaults = {
        "schedule_policy": "fcfs",
        "disable_radix_cache": False,
        "enable_priority_scheduling": False,
        "truncation_align_size": None,
        "page_size": 64,
        "chunked_prefill_size": 4096,
    }
    return SimpleNamespace(**{**defaults, **args})


def test_a_combo_the_engine_cannot_run_stops_the_scheduler(monkeypatch):
    monkeypatch.setenv("POLICYKIT_COMBO", "alignment=checkpoint:100")
    scheduler = scheduler_with(chunked_prefill_size=8192)
    with pytest.raises(startup.StartupRefused, match="checkpoint:100"):
        startup.on_scheduler_ready(None, scheduler)
    assert hooks.active() is None


def test_scheduler_start_logs_one_check_line_per_property(monkeypatch, caplog):
    monkeypatch.setenv("POLICYKIT_COMBO", "admission=reserve-tail,chunking=sglang,alignment=page")
    scheduler = scheduler_with()
    try:
        with caplog.at_level("INFO", logger="policykit.sglang"):
            startup.on_scheduler_ready(None, scheduler)
        assert hooks.active() is not None
    finally:
        hooks.activate(None)
    lines = [r.getMessage() for r in caplog.records if "policykit check:" in r.getMessage()]
    props = [line.rsplit(": ", 1)[1].split()[0] for line in lines]
    assert len(lines) >= 4 and len(set(props)) == len(props)


@pytest.mark.parametrize(
    "queue, level", [("fcfs-skip", "WARNING"), ("fcfs", "INFO"), ("lpm", "INFO")]
)
def test_scheduler_start_says_what_the_queue_policy_does(monkeypatch, caplog, queue, level):
    """The queue policy orders SGLang's queue; a skipping one is warned about at start-up,
    since a refused request still ends SGLang's round."""
    monkeypatch.setenv("POLICYKIT_COMBO", f"admission=reserve-tail,queue={queue}")
    monkeypatch.setenv("POLICYKIT_STARTUP_CHECK", "0")
    _start_scheduler(caplog)
    [record] = [r for r in caplog.records if "orders the waiting queue" in r.getMessage()]
    assert record.levelname == level and repr(queue) in record.getMessage()
    assert ("does not skip" in record.getMessage()) == (queue == "fcfs-skip")


def _start_scheduler(caplog) -> None:
    """What ``Scheduler.__init__``'s AFTER hook does on a 64-token-page, 4096-chunk engine, with
    the plugin's log captured; the combo is deactivated afterwards."""
    scheduler = scheduler_with()
    try:
        with caplog.at_level("INFO", logger="policykit.sglang"):
            startup.on_scheduler_ready(None, scheduler)
    finally:
        hooks.activate(None)


def test_combo_from_a_config_file(tmp_path):
    path = tmp_path / "combo.txt"
    path.write_text("# deployed 2026-11-30\nadmission=reserve-tail\nchunking=defer  # seed 000\n")
    assert settings.combo_text({"POLICYKIT_CONFIG": str(path)}) == (
        "admission=reserve-tail,chunking=defer"
    )
    env = {"POLICYKIT_CONFIG": str(path), "POLICYKIT_COMBO": "admission=sglang"}
    assert settings.combo_text(env) == "admission=sglang"


def test_target_check_finds_every_target():
    if not HAS_SGLANG:
        pytest.skip("the policykit[sglang] extra is absent")
    found = check.target_findings()
    assert len(found) == 5 and all(f.ok for f in found), found


def _cli(*args: str, env: dict | None = None):
    return CliRunner().invoke(main, ["sglang-plugin", *args], env=env or {})


@needs_sglang
def test_cli_check_json():
    combo = "admission=reserve-tail,queue=fcfs-skip"
    result = _cli("--check", "--combo", combo, "--no-prove", "--json")
    assert result.exit_code == 0, result.output
    data = json.loads(result.output)
    assert data["schema"] == "policykit.sglang-plugin-check/1" and data["created"]
    assert data["ready"] and data["combo"]["admission"] == "reserve-tail"
    [queue] = [f for f in data["findings"] if f["name"] == "queue"]
    assert "'fcfs-skip' orders the waiting queue, but does not skip" in queue["detail"]


def test_cli_bad_combo_is_one_paragraph_and_exit_2():
    result = _cli("--check", "--combo", "admission=nope", "--no-prove")
    assert result.exit_code == 2
    assert "Traceback" not in result.output and result.output.count("\n") == 1


def test_cli_without_check_is_bad_input():
    assert _cli().exit_code == 2


def test_cli_unsupported_version_is_not_ready(monkeypatch):
    monkeypatch.setattr(check, "installed_version", lambda: "0.5.22")
    result = _cli("--check", "--combo", "admission=reserve-tail", "--no-prove", "--json")
    assert result.exit_code == 1
    finding = json.loads(result.output)["findings"][0]
    assert not finding["ok"] and "0.5.22" in finding["detail"]


def test_start_up_verdicts_are_about_the_queue_sglang_runs(monkeypatch, caplog):
    """``fcfs-skip`` is proved free of starvation in ``policykit simulate``, but SGLang stops
    its round at a refused request: the verdict logged in the engine is the blocking queue's,
    and says so."""
    combo = "admission=sglang,chunking=sglang,alignment=none,queue=fcfs-skip"
    monkeypatch.setenv("POLICYKIT_COMBO", combo)
    _start_scheduler(caplog)
    [line] = [r.getMessage() for r in caplog.records if "no-starvation" in r.getMessage()]
    assert "no-starvation violated" in line and startup.AS_SGLANG_RUNS in line


def test_as_sglang_runs_keeps_the_order_and_drops_only_the_skip():
    combo = registry_from().resolve("admission=reserve-tail,queue=fcfs-skip")
    engine = startup.as_sglang_runs(combo)
    assert combo.queue.skips_never_fitting and not engine.queue.skips_never_fitting
    assert isinstance(engine.queue, type(combo.queue)) and engine.queue.name == "fcfs-skip"
    assert engine.admission is combo.admission
    assert startup.as_sglang_runs(registry_from().resolve("queue=lpm")).queue.name == "lpm"
