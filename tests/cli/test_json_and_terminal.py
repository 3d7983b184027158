"""``--json`` is a flag everywhere, every document carries ``schema`` and ``created``, errors
under ``--json`` are JSON on stderr; tables fit 80 columns; long work draws progress on a
terminal only, never under ``--json``."""

from __future__ import annotations

import json
import re
from importlib.util import find_spec

import pytest

from policykit import progress
from policykit.scenario import parse_scenario, swa_pool_tokens

DOCUMENTS = {
    "policies": ["policies"],
    "plugins": ["plugins"],
    "simulate": ["simulate", "seed-abc"],
    "check": ["check", "--combo", "reserve-tail/defer/page/default/fcfs-skip", "--rounds", "2"],
    "plan-memory": ["plan-memory", "--model", "llama3-8b", "--gpu-mem-gib", "80"],
    "findings": ["findings"],
}


@pytest.mark.parametrize("command", DOCUMENTS)
def test_every_document_has_schema_and_created(cli, command):
    res = cli(*DOCUMENTS[command], "--json")
    assert res.exit_code == 0, res.output
    doc = json.loads(res.stdout)
    assert doc["schema"] == f"policykit.{command}/1"
    assert doc["created"].endswith("+00:00") and "started" not in doc
    assert list(doc)[:2] == ["schema", "created"]


def test_out_writes_the_same_document(cli, tmp_path):
    out = tmp_path / "check.json"
    res = cli(
        "check",
        "--combo",
        "reserve-tail/defer/page/default/fcfs-skip",
        "--rounds",
        "2",
        "--out",
        str(out),
    )
    assert res.exit_code == 0, res.output
    doc = json.loads(out.read_text())
    assert doc["schema"] == "policykit.check/1" and doc["summary"]["proved"] == 7


ERRORS = {
    "policykit error": ["simulate", "no-such-scenario"],
    "bad combo": ["check", "--combo", "sglang/defer"],
    "usage error": ["check", "--rounds", "99"],
    "unknown option": ["sweep", "--scenarios", "seed-abc", "--no-such-option"],
    "both --all and --combo": ["bench", "--workload", "seed-abc", "--all", "--combo", "x/y/z"],
    "--min-swa-pool without SWA": ["check", "--combo", "sglang/sglang/none", "--min-swa-pool", "9"],
}


@pytest.mark.parametrize("case", ERRORS)
def test_errors_under_json_are_json_on_stderr_with_exit_2(cli, case):
    res = cli(*ERRORS[case], "--json")
    assert res.exit_code == 2, res.output
    assert res.stdout == ""
    err = json.loads(res.stderr)
    assert err["schema"] == "policykit.error/1" and err["exit_code"] == 2
    assert err["error"] and "\n" not in err["error"] and "Traceback" not in err["error"]


def test_min_swa_pool_bounds_the_search_and_is_reported(cli):
    """On sliding-window pools SGLang 0.5.23 starts with (more than window + page) the search
    is bounded, and the document and the scope line say which pools were searched. One
    request can still be stranded there behind a cached prefix's window lock, as in SGLang
    (a finding of tests/upstream/test_findings.py): exit 1, with the pool of the
    counterexample within the bound."""
    args = ["check", "--combo", "sglang/sglang/none", "--sliding-window", "512", "--json"]
    res = cli(*args, "--min-swa-pool", "577", "--requests", "1", "--rounds", "3", "--timeout", "60")
    assert res.exit_code == 1, res.output
    doc = json.loads(res.stdout)
    assert doc["config"]["min_swa_pool_tokens"] == 577
    assert "a sliding-window pool of at least 577 tokens" in doc["config"]["scope"]
    verdict = {v["property"]: v for v in doc["verdicts"]}["admitted-completes"]
    assert verdict["verdict"] == "violated"
    scenario = parse_scenario(verdict["counterexample"]["scenario"], source="counterexample")
    assert swa_pool_tokens(scenario) >= 577


def test_errors_without_json_stay_one_paragraph(cli):
    res = cli("check", "--combo", "sglang/defer")
    assert res.exit_code == 2
    assert res.stderr.startswith("Error: The combo 'sglang/defer' has 2 part(s)")
    assert res.stderr.count("\n") == 1


def _widest(text: str) -> int:
    return max(len(line.rstrip()) for line in text.splitlines())


def test_policies_fit_80_columns_one_or_two_lines_each_without_rest_markup(cli):
    res = cli("policies", columns=80)
    assert res.exit_code == 0
    assert _widest(res.stdout) <= 80
    assert "``" not in res.stdout and ":class:" not in res.stdout and "…" not in res.stdout
    assert "GUARANTEED_NO_EVICT style" in res.stdout
    # a policy's row starts with its name; its one-sentence summary wraps onto at most two
    # more lines (the whole docstring, with --verbose, took 5 to 8 in a four-column table)
    continued = 0
    for line in res.stdout.splitlines():
        if re.match(r"^ \S", line) or not line.strip():
            continued = 0
        else:
            continued += line.startswith("  ")
        assert continued <= 2, res.stdout


@pytest.mark.parametrize(
    "args",
    [
        ["simulate", "seed-incident-1keim", "--combo", "sglang/sglang/checkpoint:256"],
        ["check", "--combo", "reserve-tail/swa-reserve/truncation:192", "--rounds", "2"],
        ["plugins"],
        ["findings"],
    ],
)
def test_tables_fold_instead_of_truncating_at_80_columns(cli, args):
    res = cli(*args, columns=80)
    assert res.exit_code in (0, 1), res.output
    assert "…" not in res.stdout
    assert _widest(res.stdout) <= 80


@pytest.fixture
def watched(monkeypatch):
    """Every command's stderr taken for a terminal, outside CI; yields, per progress bar the
    command made, whether it was drawn."""
    monkeypatch.setattr(progress, "is_terminal", lambda stream: True)
    monkeypatch.delenv("CI", raising=False)
    drawn: list[bool] = []
    real = progress.shown

    def spy(stream, *, quiet):
        drawn.append(real(stream, quiet=quiet))
        return drawn[-1]

    monkeypatch.setattr(progress, "shown", spy)
    return drawn


TWO_COMBOS = ["--combo", "reserve-tail/defer/page", "--combo", "sglang/defer/page"]


@pytest.mark.parametrize(
    "args",
    [
        ["simulate", "seed-abc"],
        ["check", *TWO_COMBOS, "--rounds", "2"],
        pytest.param(
            ["conformance", "sglang", "--random", "2"],
            marks=pytest.mark.skipif(find_spec("sglang") is None, reason="needs sglang==0.5.23"),
        ),
    ],
)
def test_progress_is_drawn_on_a_terminal_and_never_under_json(cli, watched, args):
    res = cli(*args)
    assert res.exit_code in (0, 1), res.output
    assert watched and all(watched)
    watched.clear()
    res = cli(*args, "--json")
    assert res.exit_code in (0, 1), res.output
    assert watched and not any(watched)
    json.loads(res.stdout)
