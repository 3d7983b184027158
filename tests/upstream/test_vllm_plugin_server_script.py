"""The GPU check script for the vLLM plugin, on a CPU: its arguments, its dry run (a real
random-weight model directory and the engine arguments of its three runs), its refusal without
CUDA, and the verdicts it draws from three runs."""

from __future__ import annotations

import json

import pytest

from policykit.harness import vllm_server_check as script


def test_the_runs_are_vllms_own_class_then_the_plugin_twice(tmp_path):
    args = script.parse(["--workdir", str(tmp_path), "--combo", "queue=lpm"])
    model = tmp_path / "model"
    own, faithful, combo = (script.engine_args(args, model, side) for side in script.SIDES)
    assert "scheduler_cls" not in own and "additional_config" not in own
    assert faithful["scheduler_cls"] == combo["scheduler_cls"] == script.CLASS_PATH
    assert "additional_config" not in faithful
    assert combo["additional_config"] == {"policykit_combo": "queue=lpm"}
    assert own["num_gpu_blocks_override"] == 128 and own["block_size"] == 16
    lengths = [len(p) for p in script.prompts(args)]
    assert len(lengths) == 24 and min(lengths) >= 256 and max(lengths) > 512


def test_bad_arguments_exit_2(tmp_path, capsys):
    with pytest.raises(SystemExit) as stopped:
        script.parse(["--workdir", str(tmp_path), "--requests", "0"])
    assert stopped.value.code == 2
    assert "must be positive" in capsys.readouterr().err


def test_without_cuda_it_refuses_in_one_paragraph(tmp_path, capsys, monkeypatch):
    torch = pytest.importorskip("torch")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert script.main(["--workdir", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert "needs a CUDA GPU" in err and "--dry-run" in err and "Traceback" not in err
    assert not (tmp_path / "model").exists()


def test_dry_run_builds_a_model_and_prints_the_plan(tmp_path, capsys):
    pytest.importorskip("transformers", reason="building the model needs transformers")
    assert script.main(["--workdir", str(tmp_path), "--dry-run"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["schema"] == script.SCHEMA and report["created"]
    model = tmp_path / "model"
    assert (model / "config.json").is_file() and list(model.glob("*.safetensors"))
    assert set(report["engine_args"]) == set(script.SIDES)
    assert "runs" not in report


def _run(steps, answered=None, fallbacks=None, completed=24):
    return {
        "completed": completed,
        "steps": steps,
        "answered": answered,
        "fallbacks": fallbacks,
    }


def test_the_checks_need_identity_on_the_faithful_run_and_decisions_on_the_combo():
    own = [{"scheduled": [["0", 512]], "preempted": []}]
    other = [{"scheduled": [["0", 64]], "preempted": []}]
    runs = {
        "vllm": _run(own),
        "faithful": _run(own, {"chunking": 3}, {}),
        "combo": _run(other, {"chunking": 3}, {}),
    }
    assert script.checks(runs, 24) == {
        "all_completed": True,
        "faithful_is_identity": True,
        "combo_decided": True,
    }
    runs["faithful"] = _run(other, {"chunking": 3}, {})
    runs["combo"] = _run(other, {"chunking": 3}, {"chunking": 1})
    checked = script.checks(runs, 24)
    assert not checked["faithful_is_identity"] and not checked["combo_decided"]
    runs["vllm"] = {"side": "vllm", "error": "exit 1"}
    assert not script.checks(runs, 24)["all_completed"]
