"""Counterexamples replay to their failure: an OOM, or an admitted request that never completes.

``policykit check --all --export-counterexample DIR`` on the built-ins, then every exported
scenario through ``policykit simulate``: each must exit non-zero with the failure its property
names (1: OOM; 3: an admitted request that can never complete; 5: a request overtaken by
more later arrivals than the exported bound).
"""

from __future__ import annotations

import json

import pytest
from click.testing import CliRunner

from policykit.cli import main

#: the issue's example: admitted, partly computed, then failed as stuck on the SWA pool
SWA_STUCK = {
    "page_size": 64,
    "chunked_prefill_size": 4096,
    "pool": {
        "free_tokens": 1920,
        "evictable_tokens": 0,
        "swa_free_tokens": 1281,
        "sliding_window": 4096,
    },
    "kv_release_rounds": None,
    "combo": {"admission": "reserve-tail", "chunking": "swa-reserve", "alignment": "none"},
    "requests": [{"id": "A", "prompt_tokens": 1850}],
}

#: ``sglang`` admission does not reserve B's tail; A takes it and is held for good
TAIL_TAKEN = {
    "page_size": 64,
    "chunked_prefill_size": 4096,
    "pool": {"free_tokens": 4480, "evictable_tokens": 0},
    "kv_release_rounds": None,
    "combo": {"admission": "sglang", "chunking": "defer", "alignment": "checkpoint:256"},
    "requests": [
        {"id": "A", "prompt_tokens": 4352, "host_prefix_tokens": 64},
        {"id": "B", "prompt_tokens": 192, "host_prefix_tokens": 128},
    ],
}


def _simulate(tmp_path, scenario: dict) -> tuple[int, dict]:
    path = tmp_path / "scenario.json"
    path.write_text(json.dumps(scenario))
    out = CliRunner().invoke(main, ["simulate", str(path), "--json"])
    return out.exit_code, json.loads(out.stdout)


def test_simulate_reports_a_request_failed_as_stuck_after_admission(tmp_path) -> None:
    code, data = _simulate(tmp_path, SWA_STUCK)
    assert code == 3
    assert data["oom"] is None
    nc = data["never_completes"]
    assert (nc["request"], nc["cause"]) == ("A", "stuck")
    assert data["schema"] == "policykit.simulate/1" and data["created"]


def test_simulate_reports_a_request_that_owes_more_than_can_ever_be_freed(tmp_path) -> None:
    code, data = _simulate(tmp_path, TAIL_TAKEN)
    assert code == 3, data
    nc = data["never_completes"]
    assert (nc["request"], nc["cause"]) == ("A", "memory")
    assert nc["owed"] > nc["reclaimable"]


def test_held_kv_due_back_counts_as_memory_that_comes_back(tmp_path) -> None:
    """The same run, with B's KV released a round after it finishes: A completes."""
    code, data = _simulate(tmp_path, {**TAIL_TAKEN, "kv_release_rounds": 1})
    assert code == 0, data
    assert data["never_completes"] is None
    assert sorted(data["completed"]) == ["A", "B"]


@pytest.fixture(scope="module")
def exported(tmp_path_factory) -> tuple[list, object]:
    folder = tmp_path_factory.mktemp("counterexamples")
    out = CliRunner().invoke(
        main, ["check", "--all", "--json", "--export-counterexample", str(folder)]
    )
    assert out.exit_code in (1, 3), out.output
    return json.loads(out.stdout)["verdicts"], folder


@pytest.mark.slow
def test_every_violation_of_the_built_ins_is_exported(exported) -> None:
    verdicts, folder = exported
    violated = [v for v in verdicts if v["verdict"] == "violated"]
    assert violated, "the built-ins include known violations (seed 000)"
    for v in violated:
        cx = v["counterexample"]
        assert cx["failure"] is not None, (v["combo"], v["property"], v["note"])
        assert cx["failure"]["summary"].startswith(f"Round {cx['failure']['round']}: ")
    assert len(list(folder.iterdir())) == len(violated)


@pytest.mark.slow
def test_every_exported_counterexample_replays_to_its_failure(exported) -> None:
    _, folder = exported
    runner = CliRunner()
    files = sorted(folder.iterdir())
    assert files
    for path in files:
        prop = path.name.rsplit(".", 2)[-2]
        out = runner.invoke(main, ["simulate", str(path), "--json"])
        codes = (1, 3, 5) if prop == "bounded-overtaking" else (1, 3)
        assert out.exit_code in codes, f"{path.name} replays with exit {out.exit_code}"
        data = json.loads(out.stdout)
        if prop == "bounded-overtaking":  # the sorting queue (lpm): a fitting request passed over
            assert data["overtaken"] and data["overtaking_bound"] is not None, path.name
        elif data.get("node") == "preempting":  # a combo that preempts: its own simulate shape
            assert data["unfinished"], path.name
        elif prop in ("no-oom", "swa-no-oom"):
            assert data["oom"] is not None, path.name
            assert data["oom"]["pool"] == ("swa" if prop == "swa-no-oom" else "full")
        elif prop == "no-starvation":  # --all has the blocking queues (fcfs, lpm) since 2026-12
            assert data["starvation"] is not None, path.name
        else:
            assert data["never_completes"] is not None, path.name
