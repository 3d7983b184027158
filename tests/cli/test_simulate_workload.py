"""``simulate --workload`` takes what ``bench --workload`` takes, looked up by the one function
both use (:func:`policykit.harness.lookup.find_workload`), and a file that is there but holds no
workload is reported by its content, not as a missing name."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from policykit.harness.lookup import WorkloadKind, find_workload

MOONCAKE = (
    '{"timestamp": 0, "input_length": 3000, "output_length": 10, "hash_ids": [1, 2, 3, 4, 5, 6]}\n'
    '{"timestamp": 100, "input_length": 2000, "output_length": 10, "hash_ids": [1, 2, 7, 8]}\n'
)


def _one_paragraph(res) -> str:
    lines = [line for line in res.output.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("Error: "), res.output
    return lines[0]


def test_the_lookup_names_each_kind(tmp_path: Path) -> None:
    trace = tmp_path / "mc.jsonl"
    trace.write_text(MOONCAKE)
    rounds = tmp_path / "rounds.jsonl"
    rounds.write_text('{"id": "a", "prompt_tokens": 100}\n')
    assert find_workload("azure-code").kind is WorkloadKind.TRACE
    assert find_workload(str(trace)).kind is WorkloadKind.TRACE
    assert find_workload(str(rounds)).kind is WorkloadKind.TRACE_FILE
    assert find_workload("seed-abc").kind is WorkloadKind.SCENARIO
    assert find_workload("mixed").kind is WorkloadKind.GENERATED


def test_a_generated_workload_runs_round_by_round(cli) -> None:
    res = cli("simulate", "--workload", "mixed", "--json")
    assert res.exit_code == 0, res.output
    doc = json.loads(res.stdout)
    assert doc["schema"] == "policykit.simulate/1" and doc["created"]
    assert doc["workload"]["name"] == "mixed" and doc["completed"]


def test_a_trace_file_bench_replays_is_simulated_by_name(cli, tmp_path: Path) -> None:
    trace = tmp_path / "mc.jsonl"
    trace.write_text(MOONCAKE)
    res = cli("simulate", "--workload", str(trace), "--json")
    assert res.exit_code == 0, res.output
    doc = json.loads(res.stdout)
    assert doc["schema"] == "policykit.trace-bench/1" and doc["created"]
    (row,) = doc["combos"]
    assert row["status"] == "completed" and row["policy_faults"] == {}


def test_a_scenario_by_workload_is_simulate_scenario(cli) -> None:
    by_name = json.loads(cli("simulate", "seed-abc", "--json").stdout)
    by_workload = json.loads(cli("simulate", "--workload", "seed-abc", "--json").stdout)
    assert by_name["completed"] == by_workload["completed"]


@pytest.mark.parametrize(("content", "said"), [("hello\n", "starts with 'hello'"), ("", "empty")])
def test_a_file_that_is_no_workload_says_what_its_content_is(
    cli, tmp_path: Path, content: str, said: str
) -> None:
    notes = tmp_path / "notes.txt"
    notes.write_text(content)
    res = cli("simulate", "--workload", str(notes))
    assert res.exit_code == 2
    line = _one_paragraph(res)
    assert "is not a workload" in line and said in line and "no workload named" not in line


@pytest.mark.parametrize("args", [[], ["seed-abc", "--workload", "mixed"]])
def test_one_input_exactly(cli, args: list[str]) -> None:
    res = cli("simulate", *args)
    assert res.exit_code == 2
    assert "one input" in _one_paragraph(res)


def test_a_trace_request_that_waits_past_the_bound_fails_the_replay(cli, tmp_path: Path) -> None:
    """Both requests arrive together; the second waits for the first's chunks, so at a bound
    of 0 rounds it is starved: exit 5, listed in the JSON (with the bound) and the text."""
    trace = tmp_path / "mc.jsonl"
    trace.write_text(MOONCAKE.replace('"timestamp": 100', '"timestamp": 0'))
    args = ("simulate", "--workload", str(trace), "--pool-tokens", "4096")
    res = cli(*args, "--starvation-rounds", "0", "--json")
    assert res.exit_code == 5, res.output
    doc = json.loads(res.stdout)
    (row,) = doc["combos"]
    assert doc["starvation_rounds"] == 0 and [s["id"] for s in row["starved"]] == ["r1"]
    text = cli(*args, "--starvation-rounds", "0")
    assert text.exit_code == 5 and "Starved (exit 5): r1" in text.output
    assert cli(*args).exit_code == 0


def test_a_combo_that_preempts_replays_a_trace_on_its_own_node(cli, tmp_path: Path) -> None:
    trace = tmp_path / "mc.jsonl"
    trace.write_text(MOONCAKE)
    combo = "vllm/vllm/none/default/fcfs/least-progress"
    res = cli("simulate", "--workload", str(trace), "--combo", combo, "--json")
    assert res.exit_code == 0, res.output
    doc = json.loads(res.stdout)
    (row,) = doc["combos"]
    assert row["node"] == "preempting" and row["status"] == "completed"
    assert doc["replay"]["host_tier"] == "off"
    assert row["fairness"]["size_classes"]["1k-8k"]["completed"] == 2
