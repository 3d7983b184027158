"""The local executor: same outcomes as the core run in-process, and failures handled."""

from __future__ import annotations

import json
import socket

import pytest
import torch
from conftest import BENCH_COMBOS, BENCH_WORKLOADS, bench_outcome, direct, faulty, outcome

from policykit.executor import SCHEMA, Status, Unit, open_executor, run_units
from policykit.executor.local import LocalExecutor, usable_cpus
from policykit.harness.model import Decoder
from policykit.harness.presets import get_preset
from policykit.harness.runner import resolve_input, run_bench


@pytest.fixture(scope="module")
def pool():
    """Two workers shared by the module: a spawned worker pays for importing torch once."""
    with open_executor("local", workers=2, timeout=20) as executor:
        yield executor


UPSTREAM_INCIDENT = "simulate/seed-incident-1keim/sglang/sglang/checkpoint:256"


@pytest.mark.slow
def test_simulate_units_equal_the_core_run_in_process(local_sweep, simulate_units, registry):
    assert local_sweep.all_ok and not local_sweep.interrupted
    simulated = local_sweep.units[: len(simulate_units)]
    assert [r.unit.id for r in simulated] == [u.id for u in simulate_units]
    for r in simulated:
        assert outcome(r.result) == direct(registry, r.unit), r.unit.id
        assert (r.executor, r.attempts, r.errors) == ("local", 1, [])
        assert r.host == r.node == socket.gethostname()
    ooms = [r.unit.id for r in simulated if r.result["oom"] is not None]
    # the incident's upstream combo OOMs and its fix does not: the outcomes are not all alike
    assert UPSTREAM_INCIDENT in ooms
    assert len(ooms) < len(simulated)


@pytest.mark.slow
def test_bench_units_equal_the_harness_run_in_process(local_sweep, bench_units, registry):
    """Each bench unit gives the row ``policykit bench`` computes for that combo in one go."""
    rows = {r.unit.id: r.result for r in local_sweep.units[-len(bench_units) :]}
    assert list(rows) == [u.id for u in bench_units]
    torch.set_num_threads(1)
    for workload in BENCH_WORKLOADS:
        bench = resolve_input(workload, 8192, 0)
        combos = [registry.resolve(c, config=bench.config) for c in BENCH_COMBOS]
        model = Decoder(get_preset("tiny"), torch.device("cpu"), seed=0)
        expected = run_bench(bench, combos, model)["combos"]
        got = [rows[f"bench/{workload}/{c}"] for c in BENCH_COMBOS]
        assert [bench_outcome(r) for r in got] == [bench_outcome(r) for r in expected]
    # the upstream combo crashes somewhere and the fix does not: outcomes are not all alike
    statuses = {r["status"] for r in rows.values()}
    assert "crashed" in statuses and len(statuses) > 1


def test_raising_and_killed_units_are_retried_once_then_failed(pool, tmp_path):
    units = [
        faulty("raises", "raise_unit", tag="r"),
        faulty("exits", "exit_unit"),
        faulty("sigkilled", "sigkill_unit"),
        faulty("flaky", "flaky_unit", marker=str(tmp_path / "marker")),
        faulty("fine", "sleep_unit", seconds=0),
        faulty("not-a-dict", "not_a_dict_unit"),
    ]
    results = run_units(units, pool, retries=1)
    by_id = {r.unit.id: r for r in results.units}
    assert results.failed == ["raises", "exits", "sigkilled", "not-a-dict"]
    assert results.missing == []
    assert by_id["raises"].attempts == 2
    assert by_id["raises"].error.startswith("ValueError: unit r refuses (at ")
    assert by_id["exits"].errors == ["worker process died (exit code 3)"] * 2
    assert by_id["sigkilled"].errors == ["worker process died (killed by SIGKILL)"] * 2
    assert "not a dict" in by_id["not-a-dict"].error
    flaky = by_id["flaky"]
    assert (flaky.status, flaky.attempts, flaky.result) == (Status.OK, 2, {"recovered": True})
    assert flaky.errors[0].startswith("RuntimeError: first attempt fails")
    assert by_id["fine"].status is Status.OK and by_id["fine"].attempts == 1


def test_no_retry_when_retries_is_zero(pool):
    results = run_units([faulty("raises", "raise_unit", tag="x")], pool, retries=0)
    assert results.units[0].attempts == 1 and results.failed == ["raises"]


def test_a_unit_past_its_timeout_is_stopped_and_failed():
    units = [faulty("hangs", "sleep_unit", seconds=60), faulty("quick", "sleep_unit", seconds=0)]
    with LocalExecutor(2, timeout=0.5) as executor:
        results = run_units(units, executor, retries=1)
    hangs, quick = results.units
    assert hangs.status is Status.FAILED
    assert hangs.errors == ["timed out after 0.5 s (worker killed)"] * 2
    assert quick.status is Status.OK


class _InterruptAfterFirst:
    def attempt_ended(self, attempt, result):
        raise KeyboardInterrupt


def test_ctrl_c_cancels_the_rest_and_keeps_what_finished():
    units = [faulty(f"u{i}", "sleep_unit", seconds=0.05 if i == 0 else 30) for i in range(5)]
    executor = LocalExecutor(2)
    with executor:
        results = run_units(units, executor, listener=_InterruptAfterFirst())
        workers = list(executor._pool.values())
    assert results.interrupted
    assert results.units[0].status is Status.OK
    assert results.missing == ["u1", "u2", "u3", "u4"]
    assert results.failed == []
    assert all(not w.process.is_alive() for w in workers)


def test_envelope_is_json_with_schema_executor_and_node(pool, tmp_path):
    results = run_units([faulty("fine", "sleep_unit", seconds=0)], pool)
    path = tmp_path / "out.json"
    results.write(path)
    doc = json.loads(path.read_text())
    assert doc["schema"] == SCHEMA
    assert doc["executor"] == {
        "name": "local",
        "workers": 2,
        "host": pool.host,
        "gpus_per_worker": False,
    }
    (unit,) = doc["units"]
    assert unit["status"] == "ok" and unit["node"] == pool.host and unit["executor"] == "local"
    assert (doc["failed"], doc["missing"]) == ([], [])


def test_unit_ids_must_be_unique(pool):
    unit = Unit("same", "test", "faulty:sleep_unit", {"seconds": 0})
    with pytest.raises(ValueError, match="unique"):
        run_units([unit, unit], pool)


def test_each_worker_sees_one_gpu_and_a_share_of_the_cpus(monkeypatch):
    """No GPU is needed: the executor only narrows CUDA_VISIBLE_DEVICES per worker slot."""
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "3,5")
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    units = [faulty(f"u{i}", "environment_unit") for i in range(2)]
    with LocalExecutor(2) as executor:
        results = run_units(units, executor)
    threads = str(max(1, usable_cpus() // 2))
    assert [r.result for r in results.units] == [
        {"CUDA_VISIBLE_DEVICES": "3", "OMP_NUM_THREADS": threads},
        {"CUDA_VISIBLE_DEVICES": "5", "OMP_NUM_THREADS": threads},
    ]
    assert results.executor["gpus_per_worker"] is True
