"""``policykit bench``: results in one schema, and one-paragraph errors with exit code 2."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from click.testing import CliRunner

from policykit.cli import main
from policykit.harness.runner import SCHEMA

FAST = ["--model", "tiny", "--device", "cpu", "--pool-tokens", "2048"]
TWO = "admission=sglang,alignment=checkpoint:256;admission=reserve-tail,alignment=checkpoint:256"


def bench(*args: str):
    # a wide console, whatever the runner's (under pytest-xdist the table would wrap its cells)
    return CliRunner(env={"COLUMNS": "200"}).invoke(main, ["bench", *args])


def test_json_results_follow_the_schema(tmp_path: Path) -> None:
    out = tmp_path / "r.json"
    result = bench("--workload", "host-hit-heavy", "--combos", TWO, *FAST, "--out", str(out))
    assert result.exit_code == 0, result.output
    assert "crashed at round" in result.output  # the table
    data = json.loads(out.read_text())
    assert data["schema"] == SCHEMA
    assert data["workload"]["name"] == "host-hit-heavy"
    assert data["workload"]["pool_tokens"] == 2048
    assert data["model"]["preset"] == "tiny" and data["device"]["type"] == "cpu"
    unsafe, safe = data["combos"]
    assert unsafe["status"] == "crashed" and unsafe["crash"]["round"] >= 2
    assert safe["status"] == "completed"
    assert safe["requests"]["completed"] == data["workload"]["requests"]
    for row in (unsafe, safe):
        assert 0 < row["peak_kv_utilisation"] <= 1
        assert len(row["kv_utilisation"]) == row["rounds"]
        assert 0 < row["planning_share"] < 1
        assert row["mfu"] is None and row["watermark"] is None  # CPU
    assert safe["ttft_s"]["p50"] <= safe["ttft_s"]["p99"]
    assert safe["prompt_tokens_per_s"] > 0


def test_json_to_stdout_and_scenario_files() -> None:
    result = bench("--workload", "seed-abc", "--combos", "admission=reserve-tail", *FAST, "--json")
    assert result.exit_code == 0, result.output
    data = json.loads(result.stdout)
    assert data["workload"]["name"] == "seed-abc"
    assert data["workload"]["pool_tokens"] == 12032  # the scenario's own pool


def test_trace_file(tmp_path: Path) -> None:
    trace = tmp_path / "t.jsonl"
    trace.write_text(
        '{"id": "a", "prompt_tokens": 700}\n'
        '{"id": "b", "prompt_tokens": 300, "prefix_group": "g", "prefix_tokens": 200, '
        '"host_prefix_tokens": 200, "arrival_round": 2}\n'
    )
    result = bench("--workload", str(trace), "--combos", "admission=sglang", *FAST, "--json")
    assert result.exit_code == 0, result.output
    assert json.loads(result.stdout)["combos"][0]["requests"]["completed"] == 2


def _error(result) -> str:
    assert result.exit_code == 2, result.output
    assert "Traceback" not in result.output
    lines = [line for line in result.output.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("Error: ")
    return lines[0]


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--workload", "mixed", "--model", "gpt-9"], "no model preset named 'gpt-9'"),
        (["--workload", "nope", "--device", "cpu"], "no workload named 'nope'"),
        (["--workload", "mixed", "--device", "cpu", "--pool-tokens", "32"], "one 64-token page"),
        (["--workload", "mixed", "--device", "cpu", "--combos", "admission=zzz"], "zzz"),
        (["--workload", "mixed", "--device", "cpu", "--combos", ";"], "names no combination"),
        (["--workload", "mixed", "--device", "tpu"], "tpu"),
        (["--workload", "mixed", "--device", "cpu", "--out", "/no/such/dir/x.json"], "folder"),
    ],
)
def test_bad_input(args: list[str], message: str) -> None:
    assert message in _error(bench(*args))


@pytest.mark.parametrize(("content", "said"), [("hello\n", "starts with 'hello'"), ("", "empty")])
def test_a_file_that_is_no_workload_says_what_its_content_is(
    tmp_path: Path, content: str, said: str
) -> None:
    """The file is there: the error is about its content, not "no workload named"."""
    notes = tmp_path / "notes.txt"
    notes.write_text(content)
    line = _error(bench("--workload", str(notes), "--device", "cpu"))
    assert "is not a workload" in line and said in line and "no workload named" not in line


def test_negative_trace_line(tmp_path: Path) -> None:
    trace = tmp_path / "neg.jsonl"
    trace.write_text('{"id": "a", "prompt_tokens": 100}\n{"id": "b", "prompt_tokens": -3}\n')
    line = _error(bench("--workload", str(trace), "--device", "cpu"))
    assert "line 2" in line and "-3" in line


@pytest.mark.skipif(torch.cuda.is_available(), reason="this machine has CUDA")
def test_cuda_without_cuda() -> None:
    assert "no CUDA device" in _error(bench("--workload", "mixed", "--device", "cuda"))
