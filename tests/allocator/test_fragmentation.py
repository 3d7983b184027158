"""The fragmentation workload: the allocator model's rules, the dry run, and the GPU run."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
import torch

from policykit.harness.allocator_model import LARGE_BUFFER, MIB, AllocatorModel
from policykit.harness.fragmentation import Workload, main, run_all


def test_model_splits_best_fits_and_merges():
    m = AllocatorModel()
    m.alloc(1, 100 * MIB)
    m.free(1)
    m.alloc(2, 40 * MIB)  # carved from the cached 100 MiB segment, no new segment
    m.alloc(3, 30 * MIB)
    assert m.reserved == 100 * MIB and m.allocated == 70 * MIB
    m.free(2)
    m.free(3)
    m.empty_cache()
    assert m.reserved == 0  # merged back into one free segment, returned


def test_model_pinned_segment_survives_empty_cache_unless_expandable():
    for expandable, reserved in ((False, 512 * MIB), (True, LARGE_BUFFER)):
        m = AllocatorModel(expandable=expandable)
        m.alloc(1, 512 * MIB)
        m.free(1)
        m.alloc(2, 2 * MIB)  # a long-lived small tensor inside the freed block
        m.empty_cache()
        assert m.reserved == reserved, expandable


def test_model_mid_size_requests_get_a_20_mib_segment():
    m = AllocatorModel()
    m.alloc(1, 4 * MIB)
    assert m.reserved == 20 * MIB


def test_dry_run_predicts_creep_under_default_only(tmp_path):
    out = tmp_path / "frag"
    cmd = [sys.executable, "-m", "policykit.harness.fragmentation", "--dry-run", "--steps", "1000"]
    done = subprocess.run(
        [*cmd, "--out", str(out)],
        capture_output=True,
        text=True,
    )
    assert done.returncode == 0, done.stderr
    assert "predicted by the allocator model" in done.stdout
    results = json.loads((out / "fragmentation.json").read_text())
    assert (out / "fragmentation.png").stat().st_size > 0
    default = results["policies"]["default"]["frag_gap_gib"]
    phased = results["policies"]["phased-expandable"]["frag_gap_gib"]
    assert default["last"] > default["first"] + 1.0
    assert phased["max"] < 0.25
    assert default["max"] > 10 * phased["max"]


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the no-GPU answer")
def test_without_a_gpu_the_real_run_refuses(capsys):
    assert main([]) == 2
    assert "--dry-run" in capsys.readouterr().out


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_gpu_frag_gap_flat_under_phased_expandable():
    results = run_all(Workload(steps=1000, static_gib=1.0), dry_run=False, out=None)
    default = results["policies"]["default"]
    phased = results["policies"]["phased-expandable"]
    assert phased["expandable_on"] and not default["expandable_on"]
    assert default["frag_gap_gib"]["last"] > default["frag_gap_gib"]["first"]
    assert phased["frag_gap_gib"]["max"] < default["frag_gap_gib"]["max"] / 4
