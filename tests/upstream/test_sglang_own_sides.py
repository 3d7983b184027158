"""The harness that runs SGLang's own unit tests on both sides (``tests/upstream/sglang_own``).

``.ci/sglang-own-tests`` trusts two things: that ``--sglang-side=policykit`` runs a test with
the plugin's hooks on SGLang's methods and ``--sglang-side=sglang`` without them, and that the
comparison names a test that passes on SGLang's side and fails with the plugin. A probe module
(ours, written here) checks the first in a fresh interpreter per side; the second is checked on
two JUnit reports.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.upstream.sglang_own import compare

ROOT = Path(__file__).resolve().parents[2]

#: records, per test, whether SGLang's decision methods and Scheduler.__init__ carry a hook
PROBE = """
import json

from sglang.srt.managers.schedule_policy import PrefillAdder, SchedulePolicy
from sglang.srt.managers.scheduler import Scheduler


def test_probe():
    hooked = [
        hasattr(PrefillAdder.__dict__["_select_prefill_admission"], "__wrapped__"),
        hasattr(PrefillAdder.__dict__["add_chunked_req"], "__wrapped__"),
        hasattr(SchedulePolicy.__dict__["calc_priority"], "__wrapped__"),
        hasattr(Scheduler.__dict__["__init__"], "__wrapped__"),
    ]
    open(OUT, "w").write(json.dumps(hooked))
"""


def _run_side(side: str, folder: Path) -> list[bool]:
    out = folder / f"{side}.txt"
    (folder / "test_probe_module.py").write_text(f"OUT = {str(out)!r}\n{PROBE}")
    env = {k: v for k, v in os.environ.items() if k not in ("SGLANG_PLUGINS", "POLICYKIT_COMBO")}
    run = subprocess.run(
        [sys.executable, "-m", "pytest", "-p", "tests.upstream.sglang_own.sides",
         f"--sglang-side={side}", "-p", "no:cacheprovider", "-q", f"--rootdir={folder}",
         str(folder)],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=300, check=False,
    )  # fmt: skip
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    return json.loads(out.read_text())


@pytest.mark.slow
@pytest.mark.usefixtures("upstream")
@pytest.mark.parametrize("side, hooked", [("sglang", False), ("policykit", True)])
def test_each_side_runs_with_or_without_the_plugins_hooks(tmp_path, side, hooked):
    assert _run_side(side, tmp_path) == [hooked] * 4


def _junit(path: Path, cases: dict[str, str]) -> str:
    body = "".join(
        f'<testcase classname="m.T" name="{name}">'
        + {"passed": "", "failed": "<failure/>", "skipped": "<skipped/>"}[outcome]
        + "</testcase>"
        for name, outcome in cases.items()
    )
    path.write_text(f"<testsuites><testsuite>{body}</testsuite></testsuites>")
    return str(path)


def test_compare_names_what_passes_on_sglangs_side_only(tmp_path, capsys):
    sglang = _junit(tmp_path / "a.xml", {"ok": "passed", "lost": "passed", "old": "failed"})
    plugin = _junit(tmp_path / "b.xml", {"ok": "passed", "lost": "failed", "old": "failed"})
    assert compare.main([sglang, plugin]) == 1
    out = capsys.readouterr().out
    assert "sglang: 2 passed, 1 failed, 0 skipped" in out
    assert "passes on SGLang's, not with the plugin: m.T::lost" in out
    assert "fails on SGLang's own side too (not run here): m.T::old" in out
    assert compare.main([sglang, sglang]) == 0
