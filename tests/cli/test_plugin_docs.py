"""Plugin-author docs that cannot drift: view tables and the hooks page generated from the code,
the tutorial's per-kind examples run, the README's snippet is the tutorial's."""

from __future__ import annotations

import json
import re
import sys
from dataclasses import fields
from pathlib import Path

import pytest

from policykit import hookspecs
from policykit.docsgen.views import field_docs, hooks_page, kind_fragment, write_plugin_reference
from policykit.plugin_manager import make_plugin_manager
from policykit.policy import KINDS, AdmitView, AlignView, ChunkView, TailView

REPO = Path(__file__).resolve().parents[2]
EXAMPLE = REPO / "examples" / "policykit-example-policy" / "src" / "policykit_example_policy"
VIEWS = (AdmitView, TailView, ChunkView, AlignView)


@pytest.mark.parametrize("view", VIEWS, ids=lambda v: v.__name__)
def test_every_view_field_is_documented_in_the_generated_table(view):
    docs = field_docs(view)
    assert set(docs) == {f.name for f in fields(view)}, "a field lacks its #: comment"
    kind = {"AdmitView": "admission", "TailView": "admission", "ChunkView": "chunking",
            "AlignView": "alignment"}[view.__name__]  # fmt: skip
    fragment = kind_fragment(kind)
    for name, doc in docs.items():
        assert f"| `{name}` |" in fragment and doc.split("``")[0] in fragment
    assert "``" not in fragment  # reST literals became Markdown code spans


def test_the_hooks_page_lists_every_hook_in_order():
    page = hooks_page()
    specs = [n for n in vars(hookspecs) if n.startswith("policykit_")]
    positions = [page.index(f"## `{name}`") for name in specs]
    assert positions == sorted(positions) and len(specs) == 7
    assert "'" not in page.split("## ")[1]  # signatures without quoted annotations
    assert "```python\nimport policykit" in page  # the reST literal block became a fence


def test_write_plugin_reference(tmp_path):
    written = write_plugin_reference(tmp_path)
    assert {p.relative_to(tmp_path).as_posix() for p in written} == {
        *(f"views/{kind}.md" for kind in KINDS),
        "hooks.md",
    }


def test_the_tutorial_has_a_section_per_kind_with_its_generated_table():
    text = (REPO / "docs" / "tutorial.md").read_text()
    for kind in KINDS:
        assert f'--8<-- "generated/views/{kind}.md"' in text
    examples = (REPO / "examples" / "tutorial_kinds.py").read_text()
    for section in re.findall(r'--8<-- "tutorial_kinds\.py:([\w-]+)"', text):
        assert f"# --8<-- [start:{section}]" in examples
        assert f"# --8<-- [end:{section}]" in examples
    assert "generated/hooks.md" in text


def test_the_readme_policy_is_the_tutorial_policy():
    readme = (REPO / "README.md").read_text()
    section = readme.split("## Writing a policy", 1)[1]
    (code,) = re.findall(r"```python\n(.*?)```", section, re.S)[:1]
    assert code == (EXAMPLE / "__init__.py").read_text()


def test_the_readme_says_how_to_view_the_site():
    assert "python3 -m http.server -d site" in (REPO / "README.md").read_text()


@pytest.fixture
def tutorial_pm(monkeypatch):
    monkeypatch.syspath_prepend(str(REPO / "examples"))
    import tutorial_kinds

    pm = make_plugin_manager(entry_points=False)
    pm.register(tutorial_kinds, name="tutorial-kinds")
    yield pm
    sys.modules.pop("tutorial_kinds", None)


def test_the_tutorial_examples_are_proved_as_the_tutorial_says(cli, tutorial_pm):
    res = cli("check", "--combo", "reserve-tail/whole-pages/checkpoint:256/default/fcfs-skip",
              "--combo", "reserve-tail/sglang/two-pages/default/fcfs-skip", "--json",
              pm=tutorial_pm)  # fmt: skip
    assert res.exit_code == 0, res.output
    assert json.loads(res.stdout)["summary"]["proved"] == 14
    # with SGLang's fcfs queue, the default, only no-starvation fails (the queue's doing)
    res = cli("check", "--combo", "reserve-tail/whole-pages/checkpoint:256", "--json",
              pm=tutorial_pm)  # fmt: skip
    rows = json.loads(res.stdout)["verdicts"]
    assert {r["property"] for r in rows if r["verdict"] != "proved"} == {"no-starvation"}


def test_the_tutorial_queue_example_is_proved_but_for_overtaking(cli, tutorial_pm):
    res = cli("check", "--combo", "reserve-tail/sglang/page/default/least-work", "--json",
              pm=tutorial_pm)  # fmt: skip
    assert res.exit_code == 1, res.output
    rows = json.loads(res.stdout)["verdicts"]
    assert {r["property"] for r in rows if r["verdict"] != "proved"} == {"bounded-overtaking"}
    assert len([r for r in rows if r["verdict"] == "proved"]) == 6


def test_the_tutorial_allocator_phase_example_runs(cli, tutorial_pm):
    res = cli("simulate", "seed-abc", "--combo", "reserve-tail/sglang/two-pages/empty-cache",
              pm=tutorial_pm)  # fmt: skip
    assert res.exit_code == 0, res.output
    assert res.stderr == ""  # checkable: no warning
