"""Every fault and every refusal of a third-party policy names the plugin's distribution, its
module, and the file and line of its own code, for each of the six kinds: the author is sent to
their line, not to policykit's (``<string>:1``, ``policykit/cli/common.py``)."""

from __future__ import annotations

import json
import sys
import textwrap
from pathlib import Path

import pytest

from policykit.cli.simulate_outcome import EXIT_POLICY_FAULT

PLUGIN = '''
import policykit


class WrongAdmit(policykit.AdmissionPolicy):
    """Answers a string."""
    name = "blame-admit"
    def admit(self, v):
        return "yes"
    def tail_reserve(self, v):
        return 0


class WrongChunk(policykit.ChunkingPolicy):
    """Answers a chunk in words."""
    name = "blame-chunk"
    def new_chunk(self, v):
        return "all"
    def resume_chunk(self, v):
        return "rest"


class WrongAlign(policykit.AlignmentPolicy):
    """Answers None."""
    name = "blame-align"
    def align_end(self, v):
        return None


class BrokenPhase(policykit.AllocatorPhasePolicy):
    """Raises at the init-to-serving boundary."""
    name = "blame-phase"
    def on_serving(self):
        raise RuntimeError("the allocator switch broke")


class WrongQueue(policykit.QueuePolicy):
    """Ranks by a float."""
    name = "blame-queue"
    def priority(self, v):
        return v.prompt_tokens / 2


class WrongVictim(policykit.PreemptionPolicy):
    """Ranks with a string."""
    name = "blame-victim"
    def victim_rank(self, v):
        return "last"


@policykit.hookimpl
def policykit_register_policies(register):
    for cls in (WrongAdmit, WrongChunk, WrongAlign, BrokenPhase, WrongQueue, WrongVictim):
        register(cls)
'''
MODULE = "blame_policies"
DIST = "blame-policies 0.7"
#: kind -> (the combo that runs it, the method the fault or refusal is about)
KINDS = {
    "admission": ("admission=blame-admit", "admit"),
    "chunking": ("chunking=blame-chunk", "new_chunk"),
    "alignment": ("alignment=blame-align", "align_end"),
    "allocator-phase": ("allocator-phase=blame-phase", "on_serving"),
    "queue": ("queue=blame-queue", "priority"),
    "preemption": ("vllm-no-reserve/vllm/none/default/fcfs/blame-victim", "victim_rank"),
}


@pytest.fixture
def plugin(tmp_path, monkeypatch) -> Path:
    """The policies installed as a distribution with an entry point; the path of its module."""
    source = tmp_path / f"{MODULE}.py"
    source.write_text(textwrap.dedent(PLUGIN))
    dist = tmp_path / "blame_policies-0.7.dist-info"
    dist.mkdir()
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: blame-policies\nVersion: 0.7\n")
    (dist / "entry_points.txt").write_text(f"[policykit]\nblame = {MODULE}\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    yield source
    sys.modules.pop(MODULE, None)


def _line(source: Path, method: str) -> int:
    lines = source.read_text().splitlines()
    return next(i for i, text in enumerate(lines, 1) if f"def {method}(" in text)


def _names_the_plugin(said: str, source: Path, method: str) -> None:
    said = " ".join(said.split())
    assert DIST in said, said
    assert f"module {MODULE}" in said, said
    assert f"{source}:{_line(source, method)}" in said, said


def _preempting_scenario(folder: Path) -> str:
    """Two requests whose blocks do not all fit: the second's next chunk preempts."""
    doc = {
        "page_size": 16,
        "chunked_prefill_size": 64,
        "kv_release_rounds": None,
        "pool": {"free_tokens": 64, "evictable_tokens": 0},
        "requests": [
            {"id": "A", "prompt_tokens": 48, "arrival_round": 1},
            {"id": "B", "prompt_tokens": 48, "arrival_round": 1},
        ],
    }
    path = folder / "preempts.json"
    path.write_text(json.dumps(doc))
    return str(path)


@pytest.mark.parametrize("kind", list(KINDS))
def test_a_fault_in_simulate_names_the_plugin(cli, plugin, tmp_path, kind):
    combo, method = KINDS[kind]
    scenario = _preempting_scenario(tmp_path) if kind == "preemption" else "seed-abc"
    out = cli("simulate", scenario, "--combo", combo, "--json")
    assert out.exit_code == EXIT_POLICY_FAULT, out.output
    data = json.loads(out.stdout)
    said = data["policy_faults"][0]["reason"] if "policy_faults" in data else data["policy_fault"]
    _names_the_plugin(said, plugin, method)


@pytest.mark.parametrize("kind", [k for k in KINDS if k != "allocator-phase"])
def test_a_refusal_in_check_names_the_plugin(cli, plugin, kind):
    """The allocator phase is not checked (no verdict depends on it): nothing to refuse."""
    combo, method = KINDS[kind]
    out = cli("check", "--combo", combo, "--json", "--jobs", "1")
    assert out.exit_code == 2, out.output
    notes = {v["note"] for v in json.loads(out.stdout)["verdicts"] if v["verdict"] == "refused"}
    (note,) = notes
    _names_the_plugin(note, plugin, method)
