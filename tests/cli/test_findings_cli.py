"""``policykit findings`` without an engine: the list, its JSON, its errors, the status rules,
the avoiding combos' verdicts, and the pages the findings point to. Running the reproducers
on the engines is ``tests/upstream/test_findings_repro.py``."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest

from policykit import engines
from policykit.config import EngineConfig
from policykit.findings import FINDINGS, Check, status, versions
from policykit.plugin_manager import make_plugin_manager
from policykit.registry import PolicyRegistry
from policykit.spec.checkable import check_or_refuse
from policykit.spec.checker import CheckOptions

REPO = Path(__file__).resolve().parents[2]


def test_the_list_names_every_finding_on_every_listed_release(cli):
    res = cli("findings")
    assert res.exit_code == 0, res.output
    for f in FINDINGS:
        assert f.id in res.stdout
    for engine in ("vllm", "sglang"):
        for version in engines.versions(engine):
            assert f"{engines.NAMES[engine]} {version}" in res.stdout
    assert "not checked: engine absent" in res.stdout  # vLLM 0.32.0: never run


def test_the_json_lists_status_per_release_and_what_each_finding_holds(cli):
    res = cli("findings", "--json")
    assert res.exit_code == 0, res.output
    doc = json.loads(res.stdout)
    assert doc["schema"] == "policykit.findings/1" and doc["created"]
    assert set(doc["installed"]) == {"vllm", "sglang"} and "runs" not in doc
    assert [f["id"] for f in doc["findings"]] == [f.id for f in FINDINGS]
    for f in doc["findings"]:
        assert list(f["status"]) == list(engines.versions(f["engine"]))
        assert f["upstream"]
        assert all(t["url"].startswith("https://github.com/") for t in f["upstream"])
        assert (f["avoid"] is None) != (f["no_avoid"] is None)
        assert f["reproducer"].startswith("python -m policykit.findings.repro.")
        assert (REPO / f["page"]).is_file()


def test_an_unknown_finding_is_one_paragraph_with_exit_2(cli):
    res = cli("findings", "--run", "no-such")
    assert res.exit_code == 2
    assert "No finding is named 'no-such'" in res.output and "Traceback" not in res.output
    res = cli("findings", "--run", "no-such", "--json")
    assert res.exit_code == 2 and json.loads(res.stderr)["exit_code"] == 2


def test_an_absent_engine_runs_nothing_and_exits_3(cli, monkeypatch):
    monkeypatch.setattr(engines, "installed_version", lambda engine: None)
    res = cli("findings", "--run", "vllm-threshold", "--json")
    assert res.exit_code == 3, res.output
    (run,) = json.loads(res.stdout)["runs"]
    assert run["ran"] is False and run["shows_failure"] is None
    assert run["reason"].startswith("engine not installed: vLLM is not installed here")
    res = cli("findings", "--run", "sglang-swa-host-hit")
    assert res.exit_code == 3 and "engine not installed" in res.stdout


def test_status_comes_from_a_recorded_run_or_a_fix_else_it_was_not_checked():
    base = FINDINGS[0]
    fixed = dataclasses.replace(
        base,
        checks=(Check("0.33.0", True, "d", "w"), Check("0.34.0", False, "d", "w")),
        fixed_in="0.34.0",
    )
    assert status(fixed, "0.33.0") == "affected"
    assert status(fixed, "0.34.0") == "not affected"
    assert status(fixed, "0.35.0") == "fixed in 0.34.0"
    assert status(fixed, "0.32.0") == "not checked: engine absent"
    assert status(base, "0.32.0") == "not checked: engine absent"


def test_runs_are_recorded_only_on_listed_releases():
    for f in FINDINGS:
        assert {c.version for c in f.checks} <= set(versions(f)), f.id


@pytest.fixture(scope="module")
def registry() -> PolicyRegistry:
    return PolicyRegistry.from_plugins(make_plugin_manager(entry_points=False))


@pytest.mark.parametrize("finding", [f for f in FINDINGS if f.avoid], ids=lambda f: f.id)
def test_the_avoiding_combo_has_the_verdicts_its_page_quotes(registry, finding):
    avoid = finding.avoid
    combo = registry.resolve(avoid.combo, config=EngineConfig())
    got = {v.property: v.label for v in check_or_refuse(combo, EngineConfig(), CheckOptions())}
    assert {p: got[p] for p, _ in avoid.verdicts} == dict(avoid.verdicts)


def test_every_finding_has_its_page_in_the_nav_naming_its_threads_and_reproducer():
    nav = (REPO / "mkdocs.yml").read_text().split("\nnav:", 1)[1]
    index = (REPO / "docs/findings/index.md").read_text()
    assert "findings/index.md" in nav
    for f in FINDINGS:
        page = (REPO / f.page).read_text()
        assert f.page.removeprefix("docs/") in nav and f"{f.id}.md" in index
        for thread in f.upstream:
            assert f"#{thread.number}" in page, (f.id, thread.number)
        module, scenario = f.reproducer
        assert f"policykit.findings.repro.{module} {scenario}" in page
        assert (avoid := f.avoid) is None or avoid.combo in page


def test_the_index_table_is_the_data():
    index = (REPO / "docs/findings/index.md").read_text()
    for f in FINDINGS:
        statuses = "; ".join(f"{v}: {status(f, v)}" for v in versions(f))
        row = f"| [{f.id}]({f.id}.md) | {engines.NAMES[f.engine]} | {f.failure} | {statuses} |"
        assert row in index, row
