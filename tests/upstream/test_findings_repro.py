"""Every finding re-checked on the installed release of its engine (docs/findings/).

Each reproducer runs on the engine's own classes (vLLM's ``Scheduler``; SGLang's
``PrefillAdder`` and storage) and must show what policykit.findings records for that release:
the failure where it is recorded ``affected``, none where ``not affected``. A release with no
record fails here, so that a new release's CI job says to run and record it. Each contrast
(vLLM's defaults; the SGLang prompt without its host copy, or with 64-token chunks) must not
show the failure: the reproducer tells the two apart. Skips cleanly without the engine.
"""

from __future__ import annotations

import json

import pytest
from click.testing import CliRunner

from policykit.cli import main
from policykit.findings import FINDINGS, Finding
from policykit.findings.run import Outcome, run

_RUNS: dict[str, Outcome] = {}


def outcome(finding: Finding) -> Outcome:
    """The reproducer's run, once per test session; a skip where the engine is absent."""
    if finding.id not in _RUNS:
        _RUNS[finding.id] = run(finding)
    got = _RUNS[finding.id]
    if not got.ran:
        pytest.skip(got.reason)
    return got


@pytest.mark.parametrize("finding", FINDINGS, ids=lambda f: f.id)
def test_each_finding_shows_on_the_installed_release_as_recorded(finding):
    got = outcome(finding)
    record = finding.check(got.installed or "")
    assert record is not None, (
        f"{finding.id}: no run recorded for {finding.engine} {got.installed}; the reproducer "
        f"{'shows' if got.shows_failure else 'does not show'} the failure there. Record it in "
        "policykit/findings/entries.py (and fixed_in where it no longer shows)."
    )
    assert got.shows_failure == record.affected, "\n".join(got.lines)


@pytest.mark.parametrize("name", ["reservation-off", "threshold"])
def test_vllm_stalls_in_its_own_state_and_not_under_its_defaults(vllm_oracle, name):
    from policykit.findings.repro import vllm_stall

    found = vllm_stall.reproduce(name)
    b = found.state["requests"]["B"]
    assert vllm_stall.failed(found)
    assert (b["status"], b["queue"], b["num_preemptions"]) == ("PREEMPTED", "waiting", 1)
    assert found.state["requests"]["A"]["blocks_held"] > 0  # the held transfer
    default = vllm_stall.reproduce(name, defaults=True)
    assert not vllm_stall.failed(default)
    assert default.state["requests"]["B"]["num_preemptions"] == 0


def test_sglang_host_hit_is_refused_with_the_pool_free_and_admitted_without_it(upstream):
    from policykit.findings.repro import sglang_swa

    found = sglang_swa.reproduce("host-hit")
    assert sglang_swa.failed(found)
    assert {v for s in found.steps for v in s["verdicts"]} == {"NO_TOKEN"}
    assert all(s["swa_available_size"] == sglang_swa.SWA_POOL for s in found.steps)
    a, c = found.state["requests"]["A"], found.state["requests"]["C"]
    assert a["swa_reservation"] > a["size_swa"] == sglang_swa.SWA_POOL
    assert c["where"] == "waiting" and c["kv_committed_len"] == 0  # never looked at
    contrast = sglang_swa.reproduce("host-hit", contrast=True)
    assert not sglang_swa.failed(contrast) and contrast.state["pending"] == []


def test_sglang_window_lock_protects_more_than_a_window_and_64_token_chunks_finish(upstream):
    from policykit.findings.repro import sglang_swa

    found = sglang_swa.reproduce("window-lock")
    assert sglang_swa.failed(found)
    last = found.steps[-1]
    assert last["swa_protected_size"] > sglang_swa.WINDOW
    assert last["swa_available_size"] == sglang_swa.PAGE
    assert found.state["requests"]["A"]["where"] == "chunked_req"
    assert not sglang_swa.failed(sglang_swa.reproduce("window-lock", contrast=True))


def test_the_command_runs_a_finding_and_reports_the_engine_state(vllm_oracle):
    res = CliRunner().invoke(main, ["findings", "--run", "vllm-threshold", "--json"])
    assert res.exit_code == 0, res.output
    doc = json.loads(res.stdout)
    (ran,) = doc["runs"]
    assert ran["ran"] and ran["shows_failure"] and ran["installed"] == doc["installed"]["vllm"]
    assert ran["state"]["requests"]["B"]["status"] == "PREEMPTED"
    assert ran["report"][-1].startswith("STRANDED: B")
    text = CliRunner().invoke(main, ["findings", "--run", "vllm-threshold"])
    assert text.exit_code == 0 and "shows the failure." in text.stdout
