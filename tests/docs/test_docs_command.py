"""``policykit docs``: generation, the strict offline build, and its errors."""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

import pytest
from click.testing import CliRunner, Result

from policykit import progress
from policykit.cli import COMMANDS, main
from policykit.cli.docs import command_line
from policykit.docsgen import comparisons, site
from policykit.docsgen.results import combo_parts
from policykit.plugin_manager import make_plugin_manager
from policykit.registry import PolicyRegistry

from .conftest import FIXTURES, REPO, copy_docs_tree

#: every kind of results file `policykit docs` reads (the fixtures have one of each)
KINDS = {"check", "bench", "trace-bench", "trace-sweep"}

SCENARIO_MODULE = REPO / "policykit" / "scenario.py"


def test_the_built_site_has_every_page(built_site: Path):
    out = built_site / "site"
    for page in (
        "index.html",
        "tutorial/index.html",
        "concepts/tail/index.html",
        "generated/policies/index.html",
        "generated/cli/index.html",
        "generated/comparisons/index.html",
    ):
        assert (out / page).is_file(), page
    tutorial = (out / "tutorial" / "index.html").read_text()
    assert "class WatermarkAdmission(AdmissionPolicy)" not in tutorial  # highlighted, so split
    assert "WatermarkAdmission" in tutorial and "--8&lt;--" not in tutorial
    policies = (out / "generated" / "policies" / "index.html").read_text()
    assert 'id="admission-watermark"' in policies  # the installed third-party policy


def test_built_comparison_page_rows_match_registered_combinations(
    built_site: Path, example_registry: PolicyRegistry
):
    """With the example plugin installed the registry enumerates its watermark combinations
    too; the matrix has one row per admission × queue × chunking and one cell per combination."""
    html = (built_site / "site" / "generated" / "comparisons" / "index.html").read_text()
    verdicts = html.split('id="formal-verdicts"', 1)[1].split('id="scenario-replays"', 1)[0]
    body = verdicts.split("<tbody>", 1)[1].split("</tbody>", 1)[0]
    combos = comparisons.registered_combos(example_registry)
    rows = {(p["admission"], p["queue"], p["chunking"]) for p in map(combo_parts, combos)}
    assert body.count("<tr>") == len(rows)
    assert body.count('<span class="pk-cell">') == len(combos)
    assert 'href="#admission-watermark"' not in body  # rows name policies, not anchors
    assert "<code>watermark:1024</code>" in body
    for slug in re.findall(r'href="traces/([a-z0-9-]+)/"', verdicts):
        assert (built_site / "site" / "generated" / "comparisons" / "traces" / slug).is_dir()


@pytest.mark.slow
def test_docs_command_json_and_rebuild(cli_built: tuple[Path, Result], tmp_path: Path):
    root, first = cli_built
    assert first.exit_code == 0, first.output
    report = json.loads(first.stdout)
    assert report["site"] == str((root / "site").resolve())
    assert {r["kind"] for r in report["results"]} == KINDS
    assert (root / "docs" / "generated" / site.MARKER).is_file()
    shutil.copytree(root, tmp_path, dirs_exist_ok=True)  # the rebuild changes its own copy
    stale = tmp_path / "docs" / "generated" / "concepts" / "stale.md"
    stale.write_text("left over")
    args = ["docs", "--config", str(tmp_path / "mkdocs.yml")]
    again = CliRunner().invoke(main, [*args, "--results", str(FIXTURES / "results"), "--no-build"])
    assert again.exit_code == 0, again.output  # wiped and rewritten
    assert not stale.exists()


def test_without_results_it_runs_the_installed_producers(tmp_path: Path, monkeypatch):
    """Producers that are not registered are skipped with a reason; here one that is
    registered (``policies``) writes JSON no adapter reads, which is a clean error."""
    monkeypatch.setattr(
        site,
        "PRODUCERS",
        (
            site.Producer("not-a-command", ("x",), stdout=True, ok_codes=(0,)),
            site.Producer("policies", ("policies", "--json"), stdout=True, ok_codes=(0,)),
        ),
    )
    report = site.DocsReport(tmp_path)
    with pytest.raises(site.DocsError, match="wrote results docs cannot read"):
        site.run_producers(tmp_path / "results", report, command_line())
    assert report.skipped == [("not-a-command", "`policykit not-a-command` is not installed here")]
    assert (tmp_path / "results" / "policies.json").is_file()


def test_the_check_step_shows_checks_own_combos_not_one_step(tmp_path: Path, monkeypatch):
    """On a terminal the producer's bar counts what ``check`` counts (its combos, relayed from
    its process), not "0/1" for the whole command."""
    monkeypatch.setattr(progress, "is_terminal", lambda stream: True)
    monkeypatch.delenv("CI", raising=False)
    args = ("check", "--combo", "reserve-tail/defer/page", "--combo", "sglang/defer/page")
    producer = site.Producer("check", (*args, "--rounds", "2", "--json"), True, (0, 1, 3))
    monkeypatch.setattr(site, "PRODUCERS", (producer,))
    bars: list[progress.ProgressBar] = []
    step = site._step
    monkeypatch.setattr(site, "_step", lambda *a: bars.append(step(*a)) or bars[-1])
    site.run_producers(tmp_path / "results", site.DocsReport(tmp_path), command_line())
    (bar,) = bars
    assert (bar.done, bar.total) == (2, 2)
    assert bar.current in {"reserve-tail/defer/page", "sglang/defer/page"}


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        (["--config", "nowhere.yml"], "There is no mkdocs config"),
        (["--results", "no-such-dir"], "does not exist"),
        (["--out", "elsewhere"], "would show stale pages"),
    ],
)
def test_bad_input_is_one_paragraph_and_exit_2(tmp_path: Path, monkeypatch, extra, message):
    config = copy_docs_tree(tmp_path)
    monkeypatch.chdir(tmp_path)
    base = ["docs", "--config", str(config), "--results", str(FIXTURES / "results")]
    result = CliRunner().invoke(main, base + extra)
    assert result.exit_code == 2
    assert message in result.output
    assert "Traceback" not in result.output


def test_refuses_to_wipe_a_folder_it_did_not_write(tmp_path: Path):
    config = copy_docs_tree(tmp_path)
    foreign = tmp_path / "docs" / "generated"
    foreign.mkdir()
    (foreign / "notes.md").write_text("mine")
    result = CliRunner().invoke(
        main, ["docs", "--config", str(config), "--results", str(FIXTURES / "results")]
    )
    assert result.exit_code == 2
    assert "was not written by `policykit docs`" in result.output
    assert (foreign / "notes.md").read_text() == "mine"


def test_scenario_page_documents_every_field():
    """The scenario reference stays in step with the loader's list of allowed fields."""
    source = SCENARIO_MODULE.read_text()
    page = (REPO / "docs" / "scenarios.md").read_text()
    for block in ("_TOP", "_POOL", "_REQ"):
        fields = re.findall(r'"(\w+)"', source.split(f"{block} = {{", 1)[1].split("}", 1)[0])
        assert fields
        for name in fields:
            assert f"| `{name}` |" in page, f"{block}: {name}"


@pytest.mark.slow
def test_docs_on_the_cpu_defaults_builds_the_site_from_real_check_and_bench_results(
    tmp_path: Path,
):
    """The issue's acceptance, end to end: ``policykit docs`` with no results runs the real
    ``check --all --json`` and CPU ``bench --json``, then ``mkdocs build --strict`` passes; the
    comparison page has one verdict cell per registered combination (those that preempt too)
    and a replayed trace for each violation."""
    config = copy_docs_tree(tmp_path)
    registry = PolicyRegistry.from_plugins(make_plugin_manager())
    report = site.make_docs(registry, cli=command_line(), config=config, site=tmp_path / "site")
    assert {kind for _, kind in report.results} == KINDS
    assert (tmp_path / "site" / "generated" / "comparisons" / "index.html").is_file()
    generated = tmp_path / "docs" / "generated"
    page = (generated / "comparisons" / "index.md").read_text()
    section = page.split("## Formal verdicts\n", 1)[1].split("\n## ", 1)[0]
    shown = [*comparisons.registered_combos(registry), *comparisons.preempting_combos(registry)]
    assert section.count('<span class="pk-cell">') == len(shown)
    assert "not registered here" not in section
    checks = site.load_results_dir(generated / "results")
    violated = [
        v for c in checks if c.kind == "check" for v in c.verdicts if v.verdict == "violated"
    ]
    assert violated, "the seed 000 combination must be found violated"
    for v in violated:
        trace = generated / "comparisons" / "traces" / f"{comparisons.trace_slug(v)}.md"
        assert "## Replayed by the scheduler" in trace.read_text()


def test_the_docs_command_is_registered():
    assert COMMANDS["docs"] == "policykit.cli.docs:docs"
