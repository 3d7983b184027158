"""Fixtures of the docs tests: the example plugin on an entry point, a copy of the docs tree,
and one built site shared by the tests that read it.

The example package is loaded the way an installed distribution is found: a ``.dist-info``
folder whose ``entry_points.txt`` is written from the package's own ``pyproject.toml``, on
``sys.path`` (or ``PYTHONPATH`` for a subprocess), next to the package source. That exercises
the real entry-point lookup without a slow ``pip install`` per test session.
"""

from __future__ import annotations

import os
import shutil
import sys
import tomllib
from pathlib import Path

import pytest
from click.testing import CliRunner, Result

from policykit.cli import main
from policykit.cli.docs import command_line
from policykit.docsgen.site import make_docs
from policykit.plugin_manager import make_plugin_manager
from policykit.registry import PolicyRegistry

REPO = Path(__file__).resolve().parents[2]
EXAMPLE = REPO / "examples" / "policykit-example-policy"
FIXTURES = Path(__file__).with_name("fixtures")


def write_dist_info(package: Path, site: Path) -> Path:
    """A minimal installed-distribution record of ``package`` (metadata + entry points)."""
    project = tomllib.loads((package / "pyproject.toml").read_text())["project"]
    name, version = project["name"], project["version"]
    info = site / f"{name.replace('-', '_')}-{version}.dist-info"
    info.mkdir(parents=True)
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n")
    lines = []
    for group, eps in project.get("entry-points", {}).items():
        lines.append(f"[{group}]")
        lines.extend(f"{k} = {v}" for k, v in eps.items())
    (info / "entry_points.txt").write_text("\n".join(lines) + "\n")
    return info


@pytest.fixture(scope="session")
def example_paths(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """(folder holding the dist-info, the package's source root)."""
    site = tmp_path_factory.mktemp("example-site")
    write_dist_info(EXAMPLE, site)
    return site, EXAMPLE / "src"


@pytest.fixture
def example_plugin(example_paths, monkeypatch: pytest.MonkeyPatch) -> None:
    """The example plugin is installed for this test (in-process)."""
    for path in example_paths:
        monkeypatch.syspath_prepend(str(path))


@pytest.fixture(scope="session")
def example_env(example_paths) -> dict[str, str]:
    """Environment for a subprocess that sees the example plugin installed."""
    extra = os.pathsep.join(str(p) for p in example_paths)
    old = os.environ.get("PYTHONPATH")
    return {**os.environ, "PYTHONPATH": extra + (os.pathsep + old if old else "")}


def copy_docs_tree(dest: Path) -> Path:
    """mkdocs.yml, docs/ (without generated pages), examples/ and the findings' reproducers
    (the pages include them) copied to ``dest``."""
    shutil.copy2(REPO / "mkdocs.yml", dest / "mkdocs.yml")
    shutil.copytree(REPO / "docs", dest / "docs", ignore=shutil.ignore_patterns("generated"))
    for folder in ("examples", "policykit/findings/repro"):
        shutil.copytree(REPO / folder, dest / folder, ignore=shutil.ignore_patterns("__pycache__"))
    return dest / "mkdocs.yml"


@pytest.fixture(scope="session")
def example_registry(example_paths) -> PolicyRegistry:
    """The registry of an environment where the example plugin is installed."""
    saved = list(sys.path)
    sys.path[:0] = [str(p) for p in example_paths]
    try:
        return PolicyRegistry.from_plugins(make_plugin_manager())
    finally:
        sys.path[:] = saved


@pytest.fixture(scope="session")
def built_site(tmp_path_factory: pytest.TempPathFactory, example_registry) -> Path:
    """The site built once by ``make_docs`` from the fixture results, with the example plugin
    installed (so third-party policies are on the pages). The copy's root folder."""
    root = tmp_path_factory.mktemp("docs-tree")
    config = copy_docs_tree(root)
    make_docs(example_registry, cli=command_line(), config=config, results_dir=FIXTURES / "results")
    return root


@pytest.fixture(scope="session")
def cli_built(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Result]:
    """``policykit docs --json`` run once from the fixture results, as a user runs it (no
    example plugin): the copy's root folder and the CLI's result. The tests that read it share
    one strict build; a test that changes the tree works on its own copy of it."""
    root = tmp_path_factory.mktemp("cli-docs-tree")
    config = copy_docs_tree(root)
    args = ["docs", "--config", str(config), "--results", str(FIXTURES / "results"), "--json"]
    return root, CliRunner().invoke(main, args)
