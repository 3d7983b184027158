"""The GPU server check script, in its CPU dry-run mode: a real random-weight model directory
and the launch command with the plugin enabled."""

from __future__ import annotations

import json

import pytest

pytest.importorskip("transformers", reason="building the model needs transformers")

from policykit.harness import sglang_server_check


def test_dry_run_builds_a_model_and_prints_the_launch(tmp_path, capsys):
    code = sglang_server_check.main(
        ["--workdir", str(tmp_path), "--dry-run", "--combo", "admission=reserve-tail"]
    )
    assert code == 0
    report = json.loads(capsys.readouterr().out)
    assert report["schema"] == "policykit.sglang-server-check/1" and report["created"]
    model = tmp_path / "model"
    assert (model / "config.json").is_file() and list(model.glob("*.safetensors"))
    assert json.loads((model / "config.json").read_text())["num_hidden_layers"] == 2
    # -P: a policykit/ folder in the working directory cannot shadow the install
    assert report["command"][1:4] == ["-P", "-m", "sglang.launch_server"]
    assert str(model) in report["command"]
    assert report["env"] == {
        "SGLANG_PLUGINS": "policykit",
        "POLICYKIT_COMBO": "admission=reserve-tail",
    }
