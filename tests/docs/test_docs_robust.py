"""``policykit docs`` loses nothing and is never silent: staged swaps, reused results, refused
rows for an uncheckable plugin, a packaged config for any folder, no progress under --json."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from click.testing import CliRunner

from policykit.cli import main
from policykit.docsgen import site
from policykit.docsgen.check_each import check_each

from .conftest import FIXTURES, copy_docs_tree

#: every kind of results file `policykit docs` reads (the fixtures have one of each)
KINDS = {"check", "bench", "trace-bench", "trace-sweep"}

UNCHECKABLE = '''
from policykit.hookspecs import hookimpl
from policykit.policy import AdmissionPolicy


class FloatRatio(AdmissionPolicy):
    """Admits by a float ratio, which the checker's integer encoding cannot represent."""

    name = "float-ratio"

    def admit(self, v):
        return v.remaining_tokens / v.page_size < v.rem_total_tokens

    def tail_reserve(self, v):
        return 0


@hookimpl
def policykit_register_policies(register):
    register(FloatRatio)
'''


@pytest.fixture
def uncheckable_plugin(tmp_path_factory, monkeypatch) -> None:
    """A plugin whose admission policy divides with '/', installed for this process and for
    the subprocesses it starts."""
    root = tmp_path_factory.mktemp("uncheckable")
    (root / "uncheckable_policy.py").write_text(UNCHECKABLE)
    info = root / "uncheckable_policy-1.0.dist-info"
    info.mkdir()
    (info / "METADATA").write_text(
        "Metadata-Version: 2.1\nName: uncheckable-policy\nVersion: 1.0\n"
    )
    (info / "entry_points.txt").write_text("[policykit]\nfloat = uncheckable_policy\n")
    monkeypatch.syspath_prepend(str(root))
    monkeypatch.setenv("PYTHONPATH", str(root))


def _docs(*args: str):
    return CliRunner().invoke(main, ["docs", *args])


@pytest.mark.slow
def test_a_failed_run_keeps_the_previous_pages_and_site(cli_built, tmp_path: Path):
    """A broken page fails the strict build, and the pages and site of the previous run (a
    copy of the shared one) stay as they were."""
    root, first = cli_built
    assert first.exit_code == 0, first.output
    shutil.copytree(root, tmp_path, dirs_exist_ok=True)
    config = tmp_path / "mkdocs.yml"
    base = ["--config", str(config), "--results", str(FIXTURES / "results")]
    generated, built = tmp_path / "docs" / "generated", tmp_path / "site"
    page = (generated / "comparisons" / "index.md").read_text()
    html = (built / "generated" / "comparisons" / "index.html").read_text()

    (tmp_path / "docs" / "index.md").write_text("[dead](no-such-page.md)\n")  # strict fails
    failed = _docs(*base)
    assert failed.exit_code == 2 and "no-such-page.md" in failed.output
    assert "mkdocs build --strict` failed" in failed.output
    assert (generated / "comparisons" / "index.md").read_text() == page
    assert (generated / site.MARKER).is_file()
    assert (built / "generated" / "comparisons" / "index.html").read_text() == html

    bad = tmp_path / "bad-results"
    bad.mkdir()
    (bad / "check.json").write_text("not json")
    assert _docs("--config", str(config), "--results", str(bad)).exit_code == 2
    assert (generated / "comparisons" / "index.md").read_text() == page
    assert not list(generated.parent.glob(".generated*"))  # no staging folder left behind


@pytest.mark.slow
def test_results_are_kept_with_the_pages_and_can_be_reused(tmp_path: Path):
    config = copy_docs_tree(tmp_path)
    first = _docs("--config", str(config), "--results", str(FIXTURES / "results"), "--no-build")
    assert first.exit_code == 0, first.output
    kept = tmp_path / "docs" / "generated" / "results"
    assert sorted(p.name for p in kept.glob("*.json")) == sorted(
        p.name for p in (FIXTURES / "results").glob("*.json")
    )
    again = _docs("--config", str(config), "--results", str(kept), "--no-build", "--json")
    assert again.exit_code == 0, again.output
    report = json.loads(again.stdout)
    assert report["schema"] == "policykit.docs/1" and report["created"]
    assert {r["kind"] for r in report["results"]} == KINDS
    assert (
        "Refused** `no-evict/defer/page`"
        in (tmp_path / "docs" / "generated" / "comparisons" / "index.md").read_text()
    )


@pytest.mark.slow
def test_docs_from_any_folder_uses_the_packaged_config(tmp_path: Path, monkeypatch):
    """A plugin author's project has no mkdocs.yml: the packaged one is unpacked into --out
    and the site builds there, strict, without links to pages it does not have."""
    project = tmp_path / "my-plugin"
    project.mkdir()
    monkeypatch.chdir(project)
    result = _docs("--results", str(FIXTURES / "results"), "--out", "site-project")
    assert result.exit_code == 0, result.output
    root = project / "site-project"
    assert (root / "mkdocs.yml").read_text().startswith(site.SKELETON_STAMP)
    for page in ("index.html", "generated/comparisons/index.html", "generated/policies/index.html"):
        assert (root / "site" / page).is_file(), page
    comparison = (root / "docs" / "generated" / "comparisons" / "index.md").read_text()
    assert "Results files" in comparison and "results-format.md" not in comparison

    (root / "mkdocs.yml").write_text("site_name: mine\n")  # not ours: never overwritten
    refused = _docs("--results", str(FIXTURES / "results"), "--out", "site-project")
    assert refused.exit_code == 2 and "was not written by `policykit docs`" in refused.output


@pytest.mark.slow
def test_an_uncheckable_plugin_costs_one_refused_row_not_the_docs(
    tmp_path: Path, monkeypatch, uncheckable_plugin
):
    def few(registry, quiet):
        combos = [
            registry.resolve("admission=float-ratio,chunking=sglang,alignment=page"),
            registry.resolve("admission=reserve-tail,chunking=sglang,alignment=page"),
        ]
        return check_each(registry, combos=combos, rounds=2, requests=2)

    # a check run that includes the uncheckable policy, kept small; and no harness run
    monkeypatch.setattr(
        site,
        "PRODUCERS",
        (
            site.Producer(
                "check",
                ("check", "--combo", "admission=float-ratio", "--rounds", "2", "--json"),
                stdout=True,
                ok_codes=(0, 1, 3),
                fallback=few,
            ),
        ),
    )
    monkeypatch.setattr(site, "run_harness", lambda folder, report, **kw: [])
    monkeypatch.setattr(site, "run_traces", lambda folder, report, *a, **kw: [])
    config = copy_docs_tree(tmp_path)
    result = _docs("--config", str(config), "--no-build")
    assert result.exit_code == 0, result.output
    page = (tmp_path / "docs" / "generated" / "comparisons" / "index.md").read_text()
    refused = page.split("**Refused** `float-ratio/sglang", 1)[1].split("\n", 1)[0]
    assert "/" in refused and "division" in refused  # the checker's reason, in words
    assert 'class="pk-refused"' in page


def test_check_each_refuses_only_the_uncheckable_combination(uncheckable_plugin):
    from policykit.plugin_manager import make_plugin_manager
    from policykit.registry import PolicyRegistry

    registry = PolicyRegistry.from_plugins(make_plugin_manager())
    combos = [
        registry.resolve("admission=float-ratio,chunking=sglang,alignment=page"),
        registry.resolve("admission=reserve-tail,chunking=sglang,alignment=page"),
    ]
    doc = check_each(registry, combos=combos, rounds=2, requests=2)
    assert doc["schema"] == "policykit.check/1" and doc["created"]
    verdicts = {
        (
            v["combo"]["admission"] if isinstance(v["combo"], dict) else v["combo"].split("/")[0],
            v["verdict"],
        )
        for v in doc["verdicts"]
    }
    assert ("float-ratio", "refused") in verdicts
    assert {w for c, w in verdicts if c != "float-ratio"} <= {"proved", "violated", "unknown"}


def test_no_progress_under_json_on_a_non_terminal(cli_built):
    """``docs --json`` under CliRunner, whose stderr is not a terminal: no bars and no
    progress lines (each condition alone: tests/core/test_progress.py)."""
    _, result = cli_built
    assert result.exit_code == 0, result.output
    json.loads(result.stdout)
    assert "policykit docs:" not in result.stderr


def test_leftovers_of_a_killed_run_are_cleaned_and_a_moved_folder_restored(tmp_path: Path):
    generated = tmp_path / "generated"
    previous = tmp_path / ".generated.previous"  # killed between the two renames of a swap
    previous.mkdir()
    (previous / site.MARKER).write_text("")
    (previous / "page.md").write_text("kept")
    staging = tmp_path / ".generated.x1y2"  # killed while writing
    staging.mkdir()
    (staging / site.MARKER).write_text("")
    foreign = tmp_path / ".generated.mine"  # not ours: left alone
    foreign.mkdir()
    site.remove_leftovers(generated)
    assert (generated / "page.md").read_text() == "kept"
    assert not staging.exists() and not previous.exists() and foreign.is_dir()
