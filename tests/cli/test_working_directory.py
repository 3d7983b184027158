"""Every entry point works from a directory that holds folders named like policykit's own
(``policykit/``, ``spec/``, ``plugins/``, ``harness/``): the processes policykit starts keep the
working directory off their import path, and a process of the user's whose import path puts
such a folder first is told so in one paragraph (exit 2), never with a traceback."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

POLICYKIT = str(Path(sys.executable).with_name("policykit"))
SAID = "Run from another directory, rename that folder, or start Python with -P"


@pytest.fixture
def crowded(tmp_path: Path) -> Path:
    """A working directory with an empty ``policykit/``, and folders of unrelated files."""
    (tmp_path / "policykit").mkdir()
    for name in ("spec", "plugins", "harness"):
        (tmp_path / name).mkdir()
        (tmp_path / name / "notes.txt").write_text("not python\n")
    return tmp_path


def _run(argv: list[str], cwd: Path) -> subprocess.CompletedProcess:
    return subprocess.run(argv, cwd=cwd, capture_output=True, text=True, timeout=300)


def test_the_command_line_works_there(crowded: Path) -> None:
    out = _run([POLICYKIT, "policies", "--json"], crowded)
    assert out.returncode == 0, out.stderr
    assert json.loads(out.stdout)["schema"]


def test_check_from_there_gets_its_verdicts(crowded: Path) -> None:
    """``check`` forks its combos from a zygote started with ``python -c``: before it ran under
    ``-P`` it imported the empty folder and died with a traceback."""
    combo = "reserve-tail/sglang/page/default/fcfs-skip"
    out = _run([POLICYKIT, "check", "--combo", combo, "--json"], crowded)
    assert out.returncode == 0, out.stderr
    assert "Traceback" not in out.stderr
    assert {v["verdict"] for v in json.loads(out.stdout)["verdicts"]} == {"proved"}


@pytest.mark.parametrize(
    "code",
    [
        "from policykit.cli import main; main(['policies'])",
        "from policykit.integrations.vllm.startup import resolve; resolve(None)",
    ],
)
def test_a_process_that_imports_the_folder_is_told_in_one_paragraph(
    crowded: Path, code: str
) -> None:
    """``python -c`` puts the working directory first. A regular install still wins over an
    empty folder (exit 0); an editable one does not, and then the entry point says why."""
    out = _run([sys.executable, "-c", code], crowded)
    assert "ImportError" not in out.stderr and "cannot import name" not in out.stderr
    if out.returncode != 0:
        said = " ".join(out.stderr.split())
        assert SAID in said and str(crowded / "policykit") in said, out.stderr
    if out.returncode != 0 and "vllm" not in code:
        assert out.returncode == 2 and "Traceback" not in out.stderr, out.stderr
