"""How vLLM finds and starts the plugin's scheduler class: ``--scheduler-cls``, the combo's
settings, the start-up log (the combo's ``policykit check`` verdicts) and the refusals.

The scheduler is vLLM 0.33.0's real one built on a CPU (policykit.conformance.vllm.engine);
skips cleanly without the ``vllm`` extra, except for what needs no vLLM at all.
"""

from __future__ import annotations

import logging
import subprocess
import sys

import pytest

from policykit.errors import ComboError
from policykit.integrations.vllm import settings

CLASS_PATH = "policykit.integrations.vllm.PolicyAsyncScheduler"


@pytest.fixture(scope="module")
def engine(vllm_oracle):
    from policykit.conformance.vllm import engine

    return engine


def build(engine, cls=None, **config):
    """A small scheduler of ``cls`` (the plugin's by default)."""
    from policykit.integrations.vllm import PolicyAsyncScheduler

    return engine.build_scheduler(
        block_size=16,
        num_blocks=65,
        budget=256,
        max_model_len=1024,
        max_num_seqs=8,
        knobs=config.pop("knobs", engine.SchedulerKnobs()),
        scheduler_cls=cls or PolicyAsyncScheduler,
        **config,
    )


def test_importing_the_package_does_not_import_vllm():
    code = "import sys, policykit.integrations.vllm as p; print('vllm' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"


def test_vllm_resolves_the_scheduler_cls_it_is_given(engine):
    from vllm.config import SchedulerConfig
    from vllm.v1.core.sched.async_scheduler import AsyncScheduler
    from vllm.v1.core.sched.scheduler import Scheduler

    from policykit.integrations.vllm import PolicyAsyncScheduler, PolicyScheduler

    config = SchedulerConfig.default_factory(scheduler_cls=CLASS_PATH)
    assert config.get_scheduler_cls() is PolicyAsyncScheduler
    # the class vLLM recommends extending, so async scheduling stays on
    assert issubclass(PolicyAsyncScheduler, AsyncScheduler)
    assert issubclass(PolicyScheduler, Scheduler)
    assert not issubclass(PolicyScheduler, AsyncScheduler)


def test_the_combo_comes_from_additional_config_then_the_environment():
    env = {"POLICYKIT_COMBO": "queue=lpm"}
    assert settings.combo_text({"policykit_combo": "admission=vllm-no-reserve"}, env) == (
        "admission=vllm-no-reserve"
    )
    assert settings.combo_text({}, env) == "queue=lpm"
    assert settings.combo_text({}, {}) is None  # vLLM's own decisions
    with pytest.raises(ComboError, match="policykit_combo"):
        settings.combo_text({"policykit_combo": ""}, env)


def test_a_scheduler_runs_the_additional_config_combo_over_vllms_own(engine, monkeypatch):
    monkeypatch.setenv("POLICYKIT_STARTUP_CHECK", "0")
    monkeypatch.setenv("POLICYKIT_COMBO", "queue=fcfs-skip")
    sched = build(engine, additional_config={"policykit_combo": "queue=lpm"})
    # kinds it does not name are vLLM's, not policykit's SGLang-shaped defaults
    assert str(sched.combo) == "vllm/vllm/none/default/lpm/vllm"
    monkeypatch.delenv("POLICYKIT_COMBO")
    assert str(build(engine).combo) == "vllm/vllm/none/default/fcfs/vllm"


def test_startup_logs_the_combos_check_verdicts(engine, monkeypatch, caplog):
    """The lines are ``policykit check``'s own answer for the combo on the engine's block size
    and budget: a verdict per property, with its note."""
    monkeypatch.delenv("POLICYKIT_STARTUP_CHECK", raising=False)
    monkeypatch.delenv("POLICYKIT_COMBO", raising=False)
    with caplog.at_level(logging.INFO, logger="policykit.vllm"):
        sched = build(engine)
    lines = [r.getMessage() for r in caplog.records if r.name == "policykit.vllm"]
    assert any(line.startswith("policykit vLLM scheduler active with") for line in lines)
    # vLLM's own combo is proved on both properties (docs/spec.md, combos that preempt)
    expected = [
        f"policykit check: {sched.combo}: admitted-completes proved (unbounded): ",
        f"policykit check: {sched.combo}: no-starvation proved (unbounded): ",
    ]
    checked = [line for line in lines if line.startswith("policykit check:")]
    assert len(checked) == len(expected)
    assert all(line.startswith(start) for line, start in zip(checked, expected, strict=True))


@pytest.mark.parametrize(
    ("combo", "needle"),
    [
        ("queue=nope", "nope"),
        ("preemption=none", "never preempts"),
        ("admission=", "admission"),
    ],
)
def test_a_combo_that_cannot_run_stops_the_engine_with_one_paragraph(
    engine, monkeypatch, combo, needle
):
    from policykit.integrations.vllm.startup import StartupRefused

    monkeypatch.setenv("POLICYKIT_STARTUP_CHECK", "0")
    monkeypatch.setenv("POLICYKIT_COMBO", combo)
    with pytest.raises(StartupRefused) as refused:
        build(engine)
    message = str(refused.value)
    assert message.startswith("policykit vLLM scheduler refuses to start:")
    assert needle in message and "\n" not in message


def test_without_a_handler_of_its_own_the_log_goes_through_vllms(engine, monkeypatch):
    """vLLM's process configures only its ``vllm`` logger; policykit's lines use its handler."""
    from policykit.integrations.vllm import startup

    handler = logging.NullHandler()
    vllm_logger = logging.getLogger("vllm")
    vllm_logger.addHandler(handler)
    monkeypatch.setattr(startup.logger, "hasHandlers", lambda: False)
    monkeypatch.setattr(startup.logger, "level", logging.NOTSET)
    try:
        startup.route_logs()
        assert handler in startup.logger.handlers
        assert startup.logger.level == logging.INFO
    finally:
        vllm_logger.removeHandler(handler)
        startup.logger.removeHandler(handler)
