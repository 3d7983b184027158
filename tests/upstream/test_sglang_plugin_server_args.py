"""The SGLang plugin's combo from SGLang's own server args (issue #31, B).

Without ``POLICYKIT_COMBO`` the plugin runs what SGLang's server args amount to; a combo names
the kinds it overrides; what no built-in reproduces, or what the server args rule out, is
refused at start-up in one paragraph. These need only policykit (the scheduler is a stand-in
holding the fields SGLang 0.5.23's ``Scheduler`` sets), except the last, which reads SGLang's
scheduler source for those fields.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

from policykit.integrations.sglang import defaults, hooks, plugin, startup
from policykit.registry import registry_from
from tests.upstream.test_sglang_plugin_loading import scheduler_with

#: the combo whose decisions equal SGLang's own (docs/deploy-sglang.md, "How it was tested")
FAITHFUL = "admission=sglang,chunking=sglang,alignment=none,queue=fcfs"


@pytest.fixture
def no_combo(monkeypatch):
    monkeypatch.delenv("POLICYKIT_COMBO", raising=False)
    monkeypatch.delenv("POLICYKIT_CONFIG", raising=False)
    monkeypatch.setenv("POLICYKIT_STARTUP_CHECK", "0")
    yield monkeypatch
    hooks.activate(None)


def _started(scheduler, caplog) -> str:
    """Start ``scheduler``'s plugin; the combo it activated, and the line that says so."""
    with caplog.at_level("INFO", logger="policykit.sglang"):
        startup.on_scheduler_ready(None, scheduler)
    [line] = [r.getMessage() for r in caplog.records if "plugin active with" in r.getMessage()]
    return line


def _refusal(scheduler) -> str:
    with pytest.raises(startup.StartupRefused) as exc:
        startup.on_scheduler_ready(None, scheduler)
    assert hooks.active() is None
    text = str(exc.value)
    assert text.startswith("policykit SGLang plugin refuses to start: ") and "\n" not in text
    return text


def test_sglangs_defaults_are_the_faithful_combo(no_combo, caplog):
    line = _started(scheduler_with(), caplog)
    assert hooks.active().as_dict() == registry_from().resolve(FAITHFUL).as_dict()
    assert f"active with {hooks.active()} (SGLang's server args schedule_policy=fcfs," in line
    assert "page_size=64, chunked_prefill_size=4096" in line


@pytest.mark.parametrize(
    "args, queue",
    [
        ({"schedule_policy": "lpm"}, "lpm"),
        ({"schedule_policy": "fcfs"}, "fcfs"),
        # SGLang's SchedulePolicy runs lpm as fcfs without a radix tree
        ({"schedule_policy": "lpm", "disable_radix_cache": True}, "fcfs"),
    ],
)
def test_the_queue_follows_schedule_policy(no_combo, caplog, args, queue):
    _started(scheduler_with(**args), caplog)
    assert hooks.active().queue.spec == queue
    assert hooks.active().admission.spec == "sglang" and hooks.active().alignment.spec == "none"


def test_the_engine_is_the_schedulers_page_and_chunk(no_combo):
    derived = defaults.from_server_args(scheduler_with(page_size=16, chunked_prefill_size=8192))
    assert (derived.config.page_size, derived.config.chunked_prefill_size) == (16, 8192)
    off = defaults.from_server_args(scheduler_with(chunked_prefill_size=None))
    assert off.config.chunked_prefill_size == 0


def test_a_combo_overrides_only_the_kinds_it_names(no_combo, caplog):
    no_combo.setenv("POLICYKIT_COMBO", "admission=reserve-tail")
    line = _started(scheduler_with(schedule_policy="lpm"), caplog)
    combo = hooks.active()
    assert (combo.admission.spec, combo.queue.spec) == ("reserve-tail", "lpm")
    assert (combo.chunking.spec, combo.alignment.spec) == ("sglang", "none")
    assert "configured 'admission=reserve-tail'" in line


@pytest.mark.parametrize(
    "policy", ["lof", "random", "dfs-weight", "hrrn", "shortest-prefill-first", "routing-key"]
)
def test_a_schedule_policy_no_builtin_reproduces_is_refused(no_combo, policy):
    text = _refusal(scheduler_with(schedule_policy=policy))
    assert f"--schedule-policy {policy}" in text and "queue policy" in text


def test_a_combo_naming_the_queue_runs_under_such_a_schedule_policy(no_combo, caplog):
    no_combo.setenv("POLICYKIT_COMBO", "queue=fcfs")
    _started(scheduler_with(schedule_policy="lof"), caplog)
    assert hooks.active().queue.spec == "fcfs"


@pytest.mark.parametrize("combo", [None, "queue=fcfs"])
def test_priority_scheduling_is_refused_with_or_without_a_combo(no_combo, combo):
    if combo:
        no_combo.setenv("POLICYKIT_COMBO", combo)
    text = _refusal(scheduler_with(enable_priority_scheduling=True))
    assert "--enable-priority-scheduling" in text


@pytest.mark.parametrize("combo", [None, "alignment=truncation:4096"])
def test_an_alignment_sglang_needs_is_refused(no_combo, combo):
    if combo:
        no_combo.setenv("POLICYKIT_COMBO", combo)
    text = _refusal(scheduler_with(truncation_align_size=4096))
    assert "multiples of 4096 tokens" in text


def test_with_chunked_prefill_off_a_named_decision_policy_is_refused(no_combo, caplog):
    scheduler = scheduler_with(chunked_prefill_size=None)
    no_combo.setenv("POLICYKIT_COMBO", "admission=reserve-tail,queue=lpm")
    text = _refusal(scheduler)
    assert "names admission=reserve-tail, but" in text and "chunked prefill off" in text
    no_combo.setenv("POLICYKIT_COMBO", "queue=lpm")  # the queue hook still decides
    _started(scheduler, caplog)
    assert hooks.active().queue.spec == "lpm"


def test_a_preempting_combo_is_refused(no_combo):
    no_combo.setenv("POLICYKIT_COMBO", "preemption=vllm")
    assert "never preempts" in _refusal(scheduler_with())


def test_a_scheduler_without_a_field_is_refused_in_one_paragraph(no_combo):
    scheduler = scheduler_with()
    del scheduler.truncation_align_size
    assert "no attribute 'truncation_align_size'" in _refusal(scheduler)


def test_plugin_load_without_a_combo_waits_for_the_server_args(no_combo, monkeypatch):
    no_combo.setenv("SGLANG_PLUGINS", "policykit")
    registered = []
    monkeypatch.setattr(plugin, "register", lambda: registered.append(True))
    plugin.load()
    assert registered == [True] and hooks.active() is None


def test_sglangs_scheduler_sets_every_field_read(upstream):
    """The stand-in's fields are the ones SGLang 0.5.23's ``Scheduler`` assigns itself."""
    source = Path(importlib.util.find_spec("sglang.srt.managers.scheduler").origin).read_text()
    fields = defaults.from_server_args(scheduler_with()).read
    for name in (*fields, "is_hybrid_swa", "sliding_window_size"):
        assert f"self.{name} = " in source, name
