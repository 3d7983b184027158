"""The Ray executor on a local cluster started in this process: same results as local.

One ``ray.init`` serves the whole module (starting a cluster costs seconds); the executor joins
it instead of starting its own. Skipped, saying why, where the ``ray`` extra is not installed.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from conftest import bench_outcome, faulty

ray = pytest.importorskip(
    "ray", reason="the optional 'ray' extra is not installed (pip install 'policykit[ray]')"
)

from policykit.executor import Status, Unit, open_executor, run_units  # noqa: E402


@pytest.fixture(scope="module")
def cluster():
    here = str(Path(__file__).parent)  # so that Ray workers can import the faulty units
    pythonpath = os.pathsep.join(p for p in (here, os.environ.get("PYTHONPATH")) if p)
    ray.init(
        num_cpus=2,
        include_dashboard=False,
        log_to_driver=False,
        configure_logging=False,
        runtime_env={"env_vars": {"PYTHONPATH": pythonpath}},
    )
    yield ray.get_runtime_context().get_node_id()
    ray.shutdown()


@pytest.mark.slow
def test_ray_sweep_equals_the_local_sweep_unit_by_unit(
    cluster, simulate_units, bench_units, local_sweep
):
    with open_executor("ray") as executor:
        on_ray = run_units([*simulate_units, *bench_units], executor)
    assert ray.is_initialized()  # joined the module's cluster and left it running
    local = local_sweep
    assert on_ray.all_ok and local.all_ok
    assert on_ray.executor["name"] == "ray" and on_ray.executor["cpus"] == 2
    for r, here in zip(on_ray.units, local.units, strict=True):
        assert r.unit.id == here.unit.id
        if r.unit.kind == "simulate":  # OOM round, completed/pending, token totals: all of it
            assert r.result == here.result
        else:  # crashed/completed, request counts, tokens and FLOPs; timings differ
            assert bench_outcome(r.result) == bench_outcome(here.result)
        assert (r.executor, r.node) == ("ray", cluster)
        assert r.host == ray.util.get_node_ip_address()


def test_ray_retries_a_raising_and_a_crashed_unit_once_then_fails_them(cluster):
    units = [
        faulty("raises", "raise_unit", tag="r"),
        faulty("exits", "exit_unit"),
        faulty("fine", "sleep_unit", seconds=0),
    ]
    with open_executor("ray") as executor:
        results = run_units(units, executor, retries=1)
    raises, exits, fine = results.units
    assert results.failed == ["raises", "exits"]
    assert raises.attempts == 2 and raises.error.startswith("ValueError: unit r refuses")
    assert exits.attempts == 2
    assert all(e.startswith("WorkerCrashedError") for e in exits.errors), exits.errors
    assert fine.status is Status.OK and fine.node == cluster


@pytest.mark.slow
def test_smt_matrix_on_ray_equals_local(cluster):
    combos = [
        "admission=sglang,chunking=sglang,alignment=checkpoint:256",
        "admission=reserve-tail,chunking=sglang,alignment=checkpoint:256,queue=fcfs-skip",
    ]
    args = {"page_size": 64, "chunked_prefill_size": 4096, "rounds": 4, "requests": 3}
    units = [
        Unit(f"check/{c}", "check", "policykit.executor.units:check_unit", {**args, "combo": c})
        for c in combos
    ]
    with open_executor("ray") as executor:
        on_ray = run_units(units, executor)
    with open_executor("local", workers=1) as executor:
        local = run_units(units, executor)

    def verdicts(results):
        assert results.all_ok
        return [
            [(v["property"], v["verdict"]) for v in r.result["verdicts"]] for r in results.units
        ]

    assert verdicts(on_ray) == verdicts(local)
    assert ("no-oom", "violated") in verdicts(on_ray)[0]  # seed 000, found on the cluster
    assert all(v == "proved" for _, v in verdicts(on_ray)[1])
    assert {r.executor for r in on_ray.units} == {"ray"}
