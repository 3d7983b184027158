"""``policykit sweep``: exit codes, the results file, and one-paragraph errors for bad input."""

from __future__ import annotations

import json
import socket
import sys

import pytest
from click.testing import CliRunner

from policykit.cli import main
from policykit.executor import SCHEMA

UPSTREAM = "admission=sglang,chunking=sglang,alignment=checkpoint:256"
FIX = "admission=reserve-tail,chunking=sglang,alignment=checkpoint:256"


def sweep(*args: str):
    return CliRunner().invoke(main, ["sweep", *args])


def test_oom_is_a_result_not_a_failure(tmp_path):
    out = tmp_path / "sweep.json"
    res = sweep(
        "--scenarios", "seed-incident-1keim", "--combos", f"{UPSTREAM};{FIX}",
        "--workers", "1", "--out", str(out),
    )  # fmt: skip
    assert res.exit_code == 0, res.output
    assert "OOM in round 4" in res.output
    doc = json.loads(out.read_text())
    assert doc["schema"] == SCHEMA and doc["executor"]["name"] == "local"
    upstream, fix = doc["units"]
    assert upstream["result"]["oom"]["round"] == 4 and fix["result"]["oom"] is None
    assert (doc["failed"], doc["missing"]) == ([], [])


def test_a_unit_failing_after_its_retries_exits_1_and_is_listed(tmp_path):
    out = tmp_path / "sweep.json"
    res = sweep(
        "--scenarios", "seed-abc", "--combos", FIX, "--workers", "1",
        "--timeout", "0.001", "--retries", "1", "--out", str(out),
    )  # fmt: skip
    assert res.exit_code == 1, res.output
    doc = json.loads(out.read_text())
    (unit,) = doc["units"]
    assert doc["failed"] == [unit["id"]]
    assert unit["attempts"] == 2 and unit["error"].startswith("timed out after 0.001 s")


BAD = {
    "unknown scenario": (["--scenarios", "no-such"], "no bundled scenario"),
    "unknown policy": (["--scenarios", "seed-abc", "--combos", "admission=nope"], "no admission"),
    "empty combos": (["--scenarios", "seed-abc", "--combos", ";"], "names no combination"),
    "same combo twice": (["--scenarios", "seed-abc", "--combos", f"{FIX};{FIX}"], "twice"),
    "same scenario twice": (["--scenarios", "seed-abc,seed-abc"], "distinct 'name'"),
    "ray address with local": (
        ["--scenarios", "seed-abc", "--ray-address", "auto"],
        "--ray-address only applies",
    ),
    "workers with ray": (
        ["--scenarios", "seed-abc", "--executor", "ray", "--workers", "2"],
        "--workers applies to the local executor",
    ),
}


@pytest.mark.parametrize("case", BAD, ids=list(BAD))
def test_bad_input_is_one_paragraph_and_exit_2(case):
    args, needle = BAD[case]
    res = sweep(*args)
    assert res.exit_code == 2, res.output
    assert needle in res.output
    assert "Traceback" not in res.output


def test_ray_executor_without_ray_names_the_extra(monkeypatch):
    monkeypatch.setitem(sys.modules, "ray", None)  # importlib then finds no 'ray'
    res = sweep("--scenarios", "seed-abc", "--combos", FIX, "--executor", "ray")
    assert res.exit_code == 2, res.output
    assert "pip install 'policykit[ray]'" in res.output


def test_unreachable_ray_address_fails_fast_with_exit_2():
    pytest.importorskip("ray", reason="the optional 'ray' extra is not installed")
    with socket.socket() as s:  # a port that was free a moment ago: nobody listens there
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    address = f"127.0.0.1:{port}"
    res = sweep("--scenarios", "seed-abc", "--executor", "ray", "--ray-address", address)
    assert res.exit_code == 2, res.output
    assert "Nothing answers at the Ray address" in res.output
