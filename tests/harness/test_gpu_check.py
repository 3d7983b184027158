"""The prepared GPU script runs end to end on the CPU (tiny preset), so it is known to work
before a GPU is lent to run it for real."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from policykit.harness import gpu_check


def test_dry_run(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "g.json"
    assert gpu_check.main(["--dry-run", "--json", str(out)]) == 0
    text = capsys.readouterr().out
    assert "TFLOP/s" in text and "MFU" in text and "watermark" in text
    assert "crashed at round" in text  # host-hit-heavy under the unsafe combo
    data = json.loads(out.read_text())
    assert data["deviation"] < data["bound"] == 1e-4
    assert [r["workload"]["name"] for r in data["runs"]] == ["long-prompts", "host-hit-heavy"]
    for run in data["runs"]:
        assert run["workload"]["chunked_prefill_size"] == 1024
        assert len(run["combos"]) == len(gpu_check.COMBOS)


@pytest.mark.skipif(torch.cuda.is_available(), reason="this machine has CUDA")
def test_without_cuda_it_says_so(capsys: pytest.CaptureFixture[str]) -> None:
    assert gpu_check.main([]) == 2
    assert "--dry-run" in capsys.readouterr().err
